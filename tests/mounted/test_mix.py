"""Level: mounted (real FUSE mounts, real readers).

Mixtures (``[[mix]]`` in the config file) through real mounts: ``MNT/.mix/NAME/`` holds shard
files of the sources' format whose records, read in name order, are the epoch's blend:

* each source gives exactly its quota of the samples;
* a down-sampled source gives records not given before until all were given, an up-sampled one
  whole passes plus a slice;
* every stretch of 1,000 records holds each source's share within a few points;
* the same on every mount (a pure function of seed, epoch and table);
* split across ranks and loader parts, every record of the epoch's blend exactly once;
* a mixture that cannot be served refuses the mount with the reason.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

WEB, BOOKS, CODE = 4000, 1000, 1500  # records per web file (3 files), in books/, per code file (2 files)


def _lines(src: str, f: int, n: int, width: int) -> bytes:
    rng = np.random.default_rng(hash((src, f)) % 2**32)
    return b"".join(json.dumps({"src": src, "f": f, "k": k, "pad": "x" * int(rng.integers(0, width))}).encode()
                    + b"\n" for k in range(n))


def tree(root: Path) -> Path:
    src = root / "src"
    for f in range(3):
        (src / "web").mkdir(parents=True, exist_ok=True)
        (src / "web" / f"web-{f:03d}.jsonl").write_bytes(_lines("web", f, WEB, 80))
    (src / "books").mkdir()
    (src / "books" / "shelf.jsonl").write_bytes(_lines("books", 0, BOOKS, 400)[:-1])  # no last newline
    (src / "code").mkdir()
    for f in range(2):
        (src / "code" / f"c{f}.jsonl").write_bytes(_lines("code", f, CODE, 200))
    return src


def config(root: Path, samples: int | None, sources: list[tuple[str, float]], name: str = "blend",
           extra: str = "") -> Path:
    text = f'[[mix]]\nname = "{name}"\n' + (f"samples = {samples}\n" if samples else "") + extra
    for glob, weight in sources:
        text += f'[[mix.source]]\nglob = "{glob}"\nweight = {weight}\n'
    path = root / f"{name}.toml"
    path.write_text(text)
    return path


def records(mnt: Path, under: str = ".mix/blend") -> list[tuple]:
    """The mixture's records, its shards read in name order by ``cat``."""
    d = mnt / under
    names = sorted(os.listdir(d))
    out = subprocess.run(["cat", *[str(d / n) for n in names]], capture_output=True, check=True).stdout
    return [(r["src"], r["f"], r["k"]) for r in map(json.loads, out.splitlines())]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return tree(tmp_path_factory.mktemp("mixsrc"))


ARGS = ["--seed", "11", "--block-size", "1KiB", "--buffer", "128KiB"]


def test_quotas_no_repeats_before_exhaustion_and_whole_passes(mount, src, tmp_path):
    """web: 4,500 of 12,000 a epoch (down-sampled); books: 1,500 of 1,000 (up-sampled).

    Holds: SEMANTICS.md#mix-files, SEMANTICS.md#mix-counts, SEMANTICS.md#mix-passes"""
    cfg = config(tmp_path, 6000, [("web/*.jsonl", 3), ("books/*.jsonl", 1)])
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    assert ".mix" not in os.listdir(m.mnt)  # not listed: a walk of the mount reads each source once
    names = sorted(os.listdir(m.mnt / ".mix" / "blend"))
    assert names == [f"blend-{i:05d}-of-00004.jsonl" for i in range(4)]  # one shard per file by default
    web: list[collections.Counter] = []
    for epoch in range(3):
        m.set_epoch(epoch)
        got = records(m.mnt)
        assert collections.Counter(r[0] for r in got) == {"web": 4500, "books": 1500}
        web.append(collections.Counter(r for r in got if r[0] == "web"))
        books = collections.Counter(r for r in got if r[0] == "books")
        assert len(books) == BOOKS and set(books.values()) == {1, 2}  # a whole pass, then 500 again
        assert sum(v == 2 for v in books.values()) == 500
    # epochs 0 and 1: the first two slices of web's first pass, disjoint and without repeats
    assert set(web[0].values()) == set(web[1].values()) == {1} and not web[0].keys() & web[1].keys()
    # epoch 2: the rest of the pass (every record before any repeat), then the next pass's head,
    # which may hold records of that rest again (the only repeats)
    seen = web[0].keys() | web[1].keys()
    rest = web[2].keys() - seen
    assert len(rest) == 3 * WEB - 9000 and len(seen | rest) == 3 * WEB
    twice = {r for r, c in web[2].items() if c > 1}
    assert twice <= rest and max(web[2].values()) <= 2
    assert sum(web[2].values()) - len(rest) == 1500  # the second pass's head


def _deviation(got: np.ndarray, k: int = 3) -> tuple[float, float]:
    """Worst and mean distance of a source's share in 1,000-record stretches from its share."""
    share = np.bincount(got, minlength=k) / len(got)
    m = len(got) // 1000 * 1000
    counts = np.stack([np.bincount(r, minlength=k) for r in got[:m].reshape(-1, 1000)]) / 1000
    d = np.abs(counts - share)
    return float(d.max()), float(d.mean())


def test_every_thousand_records_hold_each_sources_share(mount, src, tmp_path):
    """The default (stratified) and corgipile mix the sources into every stretch as well as a
    uniform shuffle of the blend (full) does.

    Holds: SEMANTICS.md#mix-mixed"""
    cfg = config(tmp_path, 9000, [("web/*.jsonl", 5), ("code/*.jsonl", 3), ("books/*.jsonl", 2)])
    dev = {}
    for strategy in ("stratified", "corgipile", "full"):
        m = mount(None, "--seed", "11", "--block-size", "1KiB", "--buffer", "128KiB", "--strategy", strategy,
                  "--config", str(cfg), src=src)
        got = np.array([{"web": 0, "code": 1, "books": 2}[r[0]] for r in records(m.mnt)])
        assert np.array_equal(np.bincount(got), [4500, 2700, 1800])
        dev[strategy] = _deviation(got)
    for strategy in ("stratified", "corgipile"):
        assert dev[strategy][0] <= 0.05 and dev[strategy][1] <= 1.5 * dev["full"][1] + 0.003, dev


def test_the_same_blend_on_every_mount_and_epochs_differ(mount, src, tmp_path):
    cfg = config(tmp_path, 3000, [("web/*.jsonl", 1), ("code/*.jsonl", 1)])
    a = mount(None, *ARGS, "--config", str(cfg), "--epoch", "2", src=src)
    b = mount(None, *ARGS, "--config", str(cfg), "--epoch", "2", src=src)
    assert records(a.mnt) == records(b.mnt)
    a.set_epoch(3, ".mix/blend/blend-00000-of-00005.jsonl")  # a shard's epoch is its mixture's
    assert a.xattr("epoch", ".mix/blend/blend-00004-of-00005.jsonl") == "3"
    assert a.xattr("epoch", "web/web-000.jsonl") == "2"  # the sources' own views keep theirs
    assert records(a.mnt) != records(b.mnt)
    a.set_epoch(2, ".mix/blend")  # the mixture's directory: all its shards
    assert a.xattr("epoch", ".mix/blend/blend-00003-of-00005.jsonl") == "2"
    assert records(a.mnt) == records(b.mnt)


def test_ranks_and_loader_parts_split_the_blend_exactly_once(mount, src, tmp_path):
    """Holds: SEMANTICS.md#mix-ranks, SEMANTICS.md#views-torn"""
    cfg = config(tmp_path, 7001, [("web/*.jsonl", 2), ("books/*.jsonl", 1)])
    whole = mount(None, *ARGS, "--config", str(cfg), src=src)
    blend = collections.Counter(records(whole.mnt))
    ranks = [mount(None, *ARGS, "--config", str(cfg), "--rank", str(r), "--world-size", "3", src=src)
             for r in range(3)]
    shares = [collections.Counter(records(r.mnt)) for r in ranks]
    assert sum(shares, collections.Counter()) == blend
    torn = blend[("books", 0, BOOKS - 1)]  # the shelf's last line lacks its newline: given last, by the last rank
    assert torn >= 2
    assert max(sum(s.values()) for s in shares) - min(sum(s.values()) for s in shares) <= 1 + torn
    parts = [collections.Counter(records(whole.mnt, f".parts/2/{i}/.mix/blend")) for i in range(2)]
    assert parts[0] + parts[1] == blend


def test_a_csv_header_is_kept_and_headers_must_agree(mount, tmp_path):
    src = tmp_path / "csvsrc"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    (src / "a" / "x.csv").write_text("id,src\n" + "".join(f"{i},a\n" for i in range(300)))
    (src / "b" / "y.csv").write_text("id,src\n" + "".join(f"{i},b\n" for i in range(100)))
    cfg = config(tmp_path, 400, [("a/*.csv", 1), ("b/*.csv", 1)], extra="shards = 2\n")
    m = mount(None, "--config", str(cfg), src=src)
    import pandas as pd

    frames = [pd.read_csv(m.mnt / ".mix/blend" / n) for n in sorted(os.listdir(m.mnt / ".mix/blend"))]
    df = pd.concat(frames)
    assert list(df.columns) == ["id", "src"] and len(df) == 400
    assert df["src"].value_counts().to_dict() == {"a": 200, "b": 200}
    (src / "b" / "y.csv").write_text("id,source\n" + "".join(f"{i},b\n" for i in range(100)))
    m = mount(None, "--config", str(cfg), src=src)
    with pytest.raises(OSError):  # headers that disagree: an error, never one header for both
        (m.mnt / ".mix/blend/blend-00000-of-00002.csv").read_bytes()
    assert "header differs" in m.stderr() and "y.csv" in m.stderr()


@pytest.mark.parametrize("files,sources,reason", [
    ({"a/x.jsonl": b'{"a":1}\n', "b/y.csv": b"a\n1\n"}, [("a/*", 1), ("b/*", 1)], "differ in format"),
    ({"a/x.jsonl": b'{"a":1}\n'}, [("a/*", 1), ("nothing/*", 1)], "matches no data file"),
    ({"a/x.jsonl": b'{"a":1}\n'}, [("a/*", 1), ("*.jsonl", 1)], "a file belongs to one source"),
])
def test_a_mixture_that_cannot_be_served_refuses_the_mount(tmp_path, files, sources, reason):
    """Holds: SEMANTICS.md#mix-refused"""
    src = tmp_path / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cfg = config(tmp_path, 10, sources)
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt), "--config", str(cfg),
                        "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert r.returncode != 0 and reason in r.stderr, r.stderr
        assert "blend" in r.stderr
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)])


@pytest.mark.parametrize("table,message", [
    ('[[mix]]\nname = "x"\n', "needs at least one [[mix.source]]"),
    ('[[mix]]\nname = ".x"\n[[mix.source]]\nglob = "*"\n', "'name' must be"),
    ('[[mix]]\nname = "x"\nsamples = 0\n[[mix.source]]\nglob = "*"\n', "samples"),
    ('[[mix]]\nname = "x"\n[[mix.source]]\nglob = "*"\nweight = -1\n', "'weight' must be a number >= 0"),
    ('[[mix]]\nname = "x"\n[[mix.source]]\nglob = "*"\nweight = 0\n', "add up to 0"),
    ('[[mix]]\nname = "x"\nshard = 3\n[[mix.source]]\nglob = "*"\n', "unknown key(s) shard"),
    ('[[mix]]\nname = "x"\nsamples = "100"\n[[mix.source]]\nglob = "*"\n',
     "'samples' must be an integer, written without quotes: '100'"),
    ('[[mix]]\nname = "x"\nshards = "4"\n[[mix.source]]\nglob = "*"\n', "'shards' must be an integer"),
    ('[[mix]]\nname = "x"\n[[mix.source]]\nglob = "*"\nweigth = 2\n', "unknown key(s) weigth (known: glob, weight)"),
    ('[[mix]]\nname = "x"\n[[mix.source]]\nglob = "*"\n[[mix]]\nname = "x"\n[[mix.source]]\nglob = "*"\n',
     "two [[mix]] tables are named 'x'"),
])
def test_nonsense_mix_tables_are_refused_before_mounting(tmp_path, table, message):
    (tmp_path / "src").mkdir()
    (tmp_path / "mnt").mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(table)
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(tmp_path / "src"), str(tmp_path / "mnt"),
                        "--config", str(cfg)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def shufflefs(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_stat_shows_what_each_source_gave_each_epoch(mount, src, tmp_path):
    cfg = config(tmp_path, 6000, [("web/*.jsonl", 3), ("books/*.jsonl", 1)])
    m = mount(None, *ARGS, "--config", str(cfg), "--epoch", "2", src=src)
    records(m.mnt)
    r = shufflefs("stat", m.mnt)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("mixture"))
    assert "blend epoch 2: web/*.jsonl 4,500 of 12,000 (passes 0-1), books/*.jsonl 1,500 of 1,000 (passes 3-4)" in line
    info = json.loads(m.xattr("info", ".mix/blend/blend-00001-of-00004.jsonl"))
    assert info["mixture"] == "blend" and info["pool_shards"] == 4 and info["mixture_files"] == 4


def test_resumed_shards_serve_the_rest_of_the_blend_once(mount, src, tmp_path):
    """Two ranks read part of every shard, one rank resumes: what was consumed plus what it
    serves is the epoch's blend, each record as often as the blend holds it.

    Holds: SEMANTICS.md#resume-once"""
    cfg = config(tmp_path, 5000, [("web/*.jsonl", 1), ("books/*.jsonl", 1)], extra="shards = 3\n")
    two = [mount(None, *ARGS, "--config", str(cfg), "--epoch", "4", "--rank", str(r), "--world-size", "2", src=src)
           for r in range(2)]
    names = [f".mix/blend/blend-{i:05d}-of-00003.jsonl" for i in range(3)]
    whole = {rel: [m.path(rel).read_bytes().splitlines(keepends=True) for m in two] for rel in names}
    views = {rel: [{"world_size": 2, "parts": 1, "consumed": [[k * 100], [30 * k + 5]]}] for k, rel in enumerate(names)}
    one = mount(None, *ARGS, "--config", str(cfg), src=src)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"epoch": 4, "views": views}))
    r = shufflefs("epoch", one.mnt, 4, "--resume", state)
    assert r.returncode == 0, r.stderr
    served = collections.Counter()
    for rel in names:
        rest = one.path(rel).read_bytes().splitlines(keepends=True)
        firsts = [c[0] for c in views[rel][0]["consumed"]]
        assert rest == [x for s, c in zip(whole[rel], firsts) for x in s[c:]], rel
        served.update(rest)
    consumed = collections.Counter(x for rel in names for s, c in zip(whole[rel], views[rel][0]["consumed"])
                                   for x in s[:c[0]])
    fresh = mount(None, *ARGS, "--config", str(cfg), "--epoch", "4", src=src)
    blend = collections.Counter(x for rel in names for x in fresh.path(rel).read_bytes().splitlines(keepends=True))
    assert consumed + served == blend


def test_samples_beyond_memory_are_refused_with_the_reason(mount, src, tmp_path):
    cfg = config(tmp_path, 2**60, [("web/*.jsonl", 1), ("books/*.jsonl", 1)])
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    with pytest.raises(OSError):
        m.path(".mix/blend/blend-00000-of-00004.jsonl").stat()
    assert "lower its samples" in m.stderr()


def test_inspect_measures_how_a_mounted_blend_mixes_its_sources(mount, src, tmp_path):
    cfg = config(tmp_path, 9000, [("web/*.jsonl", 5), ("code/*.jsonl", 3), ("books/*.jsonl", 2)])
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    r = shufflefs("inspect", m.path(".mix/blend/blend-00002-of-00006.jsonl"), "--json", "--window", "1000")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["label"] == "source" and got["labels"] == ["web/*.jsonl", "code/*.jsonl", "books/*.jsonl"]
    assert got["records"] == 9000  # the first column is the whole blend
    blend, shard = got["strategies"].values()
    assert blend["label_tv"] <= 1.5 * got["uniform"]["label_tv"] + 0.005, got
    # the order inspect reports is the order the shards hold
    order = [r[0] for r in records(m.mnt)]
    share = collections.Counter(order)
    tv = np.mean([0.5 * sum(abs(collections.Counter(order[i: i + 1000])[s] / 1000 - share[s] / 9000) for s in share)
                  for i in range(0, 9000, 1000)])
    assert abs(tv - blend["label_tv"]) < 1e-9


def test_inspect_compares_strategies_on_a_mixture_offline(src, tmp_path):
    cfg = config(tmp_path, 9000, [("web/*.jsonl", 5), ("code/*.jsonl", 3), ("books/*.jsonl", 2)])
    r = shufflefs("inspect", src, "--mix", "blend", "--config", cfg, "--strategies", "stratified,corgipile,none",
                  "--block-size", "1KiB", "--buffer", "128KiB", "--window", "1000", "--json",
                  "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    tv = {k: v["label_tv"] for k, v in got["strategies"].items()}
    assert tv["stratified"] <= 1.5 * got["uniform"]["label_tv"] + 0.005 and tv["corgipile"] < 0.1, got
    bad = shufflefs("inspect", src, "--mix", "nope", "--config", cfg)
    assert bad.returncode == 2 and "no such mixture" in bad.stderr


def test_a_source_changed_under_an_open_shard_is_an_error_never_mixed_bytes(mount, tmp_path):
    src = tree(tmp_path)
    cfg = config(tmp_path, 6000, [("web/*.jsonl", 1), ("code/*.jsonl", 1)])
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    shard = m.path(".mix/blend/blend-00000-of-00005.jsonl")
    with open(shard, "rb", buffering=0) as f:
        first = f.read(4096)
        assert first
        with open(src / "code" / "c1.jsonl", "ab") as g:
            g.write(b'{"src": "code", "f": 1, "k": 99999, "pad": ""}\n')
        with pytest.raises(OSError) as e:
            while f.read(1 << 16):
                pass
    assert e.value.errno in (errno.ESTALE, errno.EIO)
    assert "c1.jsonl" in m.stderr()
    # a new open shows the new version whole: the appended record may be drawn, nothing is mixed
    got = records(m.mnt)
    assert len(got) == 6000 and collections.Counter(r[0] for r in got) == {"web": 3000, "code": 3000}
    assert len(set(got)) == 6000


def test_a_source_that_loses_its_files_is_an_error_naming_the_mixture(mount, tmp_path):
    src = tree(tmp_path)
    cfg = config(tmp_path, 100, [("web/*.jsonl", 1), ("books/*.jsonl", 1)])
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    assert len(records(m.mnt)) == 100
    (src / "books" / "shelf.jsonl").rename(src / "books" / "shelf.jsonl.old")
    time.sleep(1.2)  # the tree is walked again after a second
    with pytest.raises(OSError) as e:
        os.listdir(m.path(".mix/blend"))
    assert e.value.errno == errno.EIO
    assert "mixture 'blend': source #2 ('books/*.jsonl') matches no data file" in m.stderr()
    (src / "books" / "shelf.jsonl.old").rename(src / "books" / "shelf.jsonl")
    time.sleep(1.2)
    assert len(records(m.mnt)) == 100  # back


def test_more_shards_than_records_and_many_readers_at_once(mount, src, tmp_path):
    cfg = config(tmp_path, 30, [("web/*.jsonl", 1), ("books/*.jsonl", 1)], extra="shards = 50\n")
    big = config(tmp_path, 8000, [("web/*.jsonl", 1), ("code/*.jsonl", 1)], name="big")
    both = tmp_path / "both.toml"
    both.write_text(cfg.read_text() + big.read_text())
    m = mount(None, *ARGS, "--config", str(both), src=src)
    assert sorted(os.listdir(m.path(".mix"))) == ["big", "blend"]
    small = records(m.mnt)
    assert len(small) == 30 and len(os.listdir(m.path(".mix/blend"))) == 50
    want = collections.Counter(records(m.mnt, ".mix/big"))
    names = sorted(os.listdir(m.path(".mix/big")))

    def one(i: int) -> collections.Counter:
        order = names[i % len(names):] + names[: i % len(names)]
        out = collections.Counter()
        for n in order:
            out.update((r["src"], r["f"], r["k"]) for r in map(json.loads, m.path(f".mix/big/{n}").read_bytes().splitlines()))
        return out

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for got in pool.map(one, range(16)):
            assert got == want


@pytest.mark.parametrize("balance", [["--balance"], ["--balance-field", "k"]])
def test_balanced_ranks_split_a_blend_and_a_pool(mount, src, tmp_path, balance):
    """--balance over a mixture and over a pool (by byte length, or by a field): every record
    of the epoch once across the ranks."""
    cfg = config(tmp_path, 3000, [("web/*.jsonl", 2), ("books/*.jsonl", 1)])
    args = [*ARGS, "--strategy", "full", *balance, "--config", str(cfg), "--pool", "web/*.jsonl"]
    whole = mount(None, *args, src=src)
    ranks = [mount(None, *args, "--rank", str(r), "--world-size", "2", src=src) for r in range(2)]
    blend = collections.Counter(records(whole.mnt))
    assert sum((collections.Counter(records(r.mnt)) for r in ranks), collections.Counter()) == blend
    pool = [f"web/web-{i:03d}.jsonl" for i in range(3)]
    got = collections.Counter(line for r in ranks for p in pool for line in r.path(p).read_bytes().splitlines())
    assert got == collections.Counter(line for p in pool for line in (src / p).read_bytes().splitlines())


def test_a_source_without_records_asked_for_some_is_eio_with_the_reason(mount, tmp_path):
    """Holds: SEMANTICS.md#mix-refused"""
    cfg = config(tmp_path, 5, [("a/*.jsonl", 1), ("b/*.jsonl", 1)])
    m = mount({"a/1.jsonl": b'{"x": 1}\n{"x": 2}\n', "b/empty.jsonl": b""}, "--config", str(cfg), "--no-pool")
    with pytest.raises(OSError) as e:
        m.path(".mix/blend/blend-00000-of-00002.jsonl").read_bytes()
    assert e.value.errno == errno.EIO
    assert "mixture 'blend': source #2 has no records but is asked for 2" in m.stderr()
