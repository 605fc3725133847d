"""Level: mounted (real FUSE mounts, real readers).

What works for plain text works for compressed text: a pool of ``.jsonl.gz`` shards, rank shares
and loader parts (``.parts``) hold every record exactly once; an epoch resumes after a stop, also
from a state of ranks' parts on another layout; a mixture of compressed JSON lines blends its
sources; ``shufflefs inspect --label-field`` measures a compressed view and verifies it, and
measures a compressed source file as the plain file of its records; a record-level order reads a
decoded copy.  Every view is read
by a ``gzip.open`` or ``zstandard`` line loop."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

import compressed_files as cf
from test_compressed_readers import line_loop

SHARDS = 3
N = 4000  # records per shard


def shard_files() -> tuple[dict[str, bytes], collections.Counter]:
    """Three label-sorted shards of one pool (one gzip member, bgzip-like members, one more)."""
    files, every = {}, collections.Counter()
    for s in range(SHARDS):
        plain = cf.jsonl(N, seed=10 + s)
        files[f"train-{s:05d}-of-{SHARDS:05d}.jsonl.gz"] = cf.gz(plain, members=1 + 2 * s)
        every.update(cf.lines_of(plain))
    return files, every


def shufflefs(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_pool_shards_ranks_and_parts_hold_every_record_exactly_once(mount):
    """Holds: SEMANTICS.md#ranks-pools, SEMANTICS.md#ranks-share, SEMANTICS.md#ranks-parts,
    SEMANTICS.md#views-compressed"""
    files, every = shard_files()
    whole = mount(files, "--seed", "3")
    got = collections.Counter()
    for name in files:
        got.update(line_loop(whole.path(name)))
    assert got == every
    ranks = [mount(None, "--seed", "3", "--rank", str(r), "--world-size", "2", src=whole.src) for r in range(2)]
    counts, union = [], collections.Counter()
    for m in ranks:
        for i in range(3):  # three loader parts of each rank
            part = collections.Counter()
            for name in files:
                part.update(line_loop(m.path(f".parts/3/{i}/{name}")))
            union.update(part)
        mine = sum(len(line_loop(m.path(name))) for name in files)
        counts.append(mine)
    assert union == every  # each record once over all ranks and parts
    assert abs(counts[0] - counts[1]) <= 1 and sum(counts) == SHARDS * N


def test_an_epoch_resumes_after_a_stop(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-same, SEMANTICS.md#resume-once"""
    plain = cf.jsonl(6000, seed=4)
    m = mount({"a.jsonl.gz": cf.gz(plain), "b.jsonl.zst": cf.zst(plain, frame=1 << 20)}, "--seed", "1")
    views = {}
    whole = {name: line_loop(m.path(name)) for name in ("a.jsonl.gz", "b.jsonl.zst")}
    for name in whole:
        views[name] = [{"world_size": 1, "parts": 1, "consumed": [[1234]]}]
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"epoch": 0, "views": views}))
    r = shufflefs("epoch", m.path(), 0, "--resume", state)
    assert r.returncode == 0, r.stderr
    for name, lines in whole.items():
        rest = line_loop(m.path(name))
        assert rest == lines[1234:], name  # the rest of the epoch's view, byte for byte


def test_a_mixture_of_compressed_json_lines(mount, tmp_path):
    """Holds: SEMANTICS.md#mix-counts, SEMANTICS.md#mix-files"""
    web, books = cf.jsonl(6000, seed=20), cf.jsonl(2000, seed=21)
    files = {"web/w.jsonl.gz": cf.gz(web), "books/b.jsonl.gz": cf.gz(books, members=4)}
    cfg = tmp_path / "mix.toml"
    cfg.write_text('[[mix]]\nname = "blend"\nsamples = 4000\nshards = 2\n'
                   '[[mix.source]]\nglob = "web/*.jsonl.gz"\nweight = 3\n'
                   '[[mix.source]]\nglob = "books/*.jsonl.gz"\nweight = 1\n')
    m = mount(files, "--config", str(cfg))
    names = sorted(p.name for p in m.path(".mix/blend").iterdir())
    assert names == ["blend-00000-of-00002.jsonl.gz", "blend-00001-of-00002.jsonl.gz"]
    got = [line for n in names for line in line_loop(m.path(f".mix/blend/{n}"))]
    web_set, books_set = set(cf.lines_of(web)), set(cf.lines_of(books))
    assert len(got) == 4000 and sum(line in web_set for line in got) == 3000
    assert sum(line in books_set for line in got) == 1000 and len(set(got)) == 4000


def test_inspect_measures_and_verifies_a_compressed_view(mount):
    """Holds: SEMANTICS.md#views-compressed, SEMANTICS.md#views-mix"""
    plain = cf.jsonl(9000, seed=6)
    m = mount({"t.jsonl.gz": cf.gz(plain)})
    r = shufflefs("inspect", m.path("t.jsonl.gz"), "--label-field", "label", "--window", "100", "--verify", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["verified"] and got["format"] == "lines-gzip" and got["records"] == 9000
    (view,) = got["strategies"].values()
    assert view["label_tv"] < 1.3 * got["expected"]["label_tv"], got  # about a uniform shuffle's
    mix, uniform = cf.label_mix(cf.labels_of(line_loop(m.path("t.jsonl.gz"))))  # what a reader gets
    assert abs(mix - view["label_tv"]) < 1e-9 and abs(uniform - got["expected"]["label_tv"]) < 1e-9


@pytest.mark.parametrize("strategy", ["full", "lirs-page"])
def test_a_record_level_order_reads_a_decoded_copy(mount, strategy: str):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    plain = cf.jsonl(5000, seed=7)
    m = mount({"r.jsonl.gz": cf.gz(plain)}, "--strategy", strategy)
    got = line_loop(m.path("r.jsonl.gz"))
    assert collections.Counter(got) == collections.Counter(cf.lines_of(plain))
    info = json.loads(m.xattr("info", "r.jsonl.gz"))["compressed"]
    assert info["read_from"] == "a decoded copy" and "record by record" in info["copied_because"]


def test_inspect_of_a_compressed_source_file_measures_its_decoded_records(tmp_path):
    """Holds: SEMANTICS.md#views-compressed"""
    plain = cf.jsonl(5000, seed=8)
    files = {"t.jsonl": plain, "t.jsonl.gz": cf.gz(plain, members=2), "t.jsonl.zst": cf.zst(plain)}
    got = {}
    (tmp_path / "src").mkdir()
    for name, body in files.items():
        (tmp_path / "src" / name).write_bytes(body)
        r = shufflefs("inspect", tmp_path / "src" / name, "--label-field", "label", "--json", "--cache-dir", tmp_path / "c")
        assert r.returncode == 0, r.stderr
        got[name] = json.loads(r.stdout)
    assert got["t.jsonl.gz"]["format"] == "lines-gzip" and got["t.jsonl.zst"]["format"] == "lines-zstd"
    assert got["t.jsonl.gz"]["records"] == 5000 and got["t.jsonl.gz"]["labels"] == [str(i) for i in range(10)]
    for name in ("t.jsonl.gz", "t.jsonl.zst"):  # the plain file's measures: the same records and plans
        assert got[name]["strategies"] == got["t.jsonl"]["strategies"], name
        assert got[name]["expected"] == got["t.jsonl"]["expected"], name


def test_an_epoch_of_ranks_and_parts_resumes_on_another_layout(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-other, SEMANTICS.md#resume-once"""
    plain = cf.jsonl(6000, seed=9)
    files = {"a.jsonl.gz": cf.gz(plain, members=3), "b.jsonl.zst": cf.zst(plain, frame=1 << 20)}
    first = mount(files, "--seed", "2", "--world-size", "2", "--rank", "0", name="r0")
    old = [first, mount(None, "--seed", "2", "--world-size", "2", "--rank", "1", src=first.src, name="r1")]
    consumed = [[100, 250], [0, 1234]]
    views, rests = {}, {}
    for name in files:
        parts = [[line_loop(m.path(f".parts/2/{i}/{name}")) for i in range(2)] for m in old]
        views[name] = [{"world_size": 2, "parts": 2, "consumed": consumed}]
        rests[name] = [line for r in range(2) for i in range(2) for line in parts[r][i][consumed[r][i]:]]
        taken = [line for r in range(2) for i in range(2) for line in parts[r][i][: consumed[r][i]]]
        assert collections.Counter(taken + rests[name]) == collections.Counter(cf.lines_of(plain))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"epoch": 0, "views": views}))
    new = mount(None, "--seed", "2", src=old[0].src, name="one")
    r = shufflefs("epoch", new.path(), 0, "--resume", state)
    assert r.returncode == 0, r.stderr
    for name in files:
        assert line_loop(new.path(name)) == rests[name], name  # the old views' rests, whole, in order
