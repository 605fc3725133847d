"""Level: mounted (real FUSE mounts, real readers).

A text file whose last line has no newline (a file being appended to, or saved without one):
its torn last line is never shuffled into the middle of a view.  A JSON-lines loop reads every
view; every complete line comes exactly once, and the torn one only at the very end of the
epoch's last view (a file's view, the last rank's last part, a pool's last shard), unchanged, so
a file's view has the file's size.  An append while mounted: the new version shows the finished
line as a record like any other.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SEED = "11"
ARGS = ["--seed", SEED, "--block-size", "4KiB", "--buffer", "16KiB"]
STRATEGIES = ["stratified", "corgipile", "block", "full", "once", "lirs-page", "window", "pls", "none"]
TORN = b'{"i": 2000, "text": "half writ'


def complete(n: int, tag: str = "a") -> list[bytes]:
    return [json.dumps({"i": i, "src": tag, "text": "x" * (i * 7 % 61)}).encode() for i in range(n)]


def jsonl_loop(path: Path) -> tuple[list[bytes], bytes | None]:
    """A JSON-lines reader: every line parsed; a line that does not parse must be the file's last
    (it is returned apart), never one in the middle."""
    good, torn = [], None
    with open(path, "rb") as f:
        for line in f:
            assert torn is None, f"{path}: a line that is no JSON ({torn!r}) before other lines"
            try:
                json.loads(line)
            except ValueError:
                torn = line
                continue
            assert line.endswith(b"\n") or f.read(1) == b"", f"{path}: an unterminated line in the middle"
            good.append(line.rstrip(b"\n"))
    return good, torn


def shufflefs(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_torn_last_line_stays_last_and_unchanged_in_every_epoch(mount, strategy):
    """Holds: SEMANTICS.md#views-torn, SEMANTICS.md#views-size, SEMANTICS.md#views-records"""
    lines = complete(2000)
    files = {"a.jsonl": b"\n".join(lines) + b"\n" + TORN,
             "c.csv": b"k,v\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(500)) + b"500,2"}
    m = mount(files, *ARGS, "--strategy", strategy)
    views = set()
    for epoch in range(4):
        m.set_epoch(epoch)
        path = m.path("a.jsonl")
        assert os.stat(path).st_size == len(files["a.jsonl"])
        good, torn = jsonl_loop(path)
        assert torn == TORN
        assert collections.Counter(good) == collections.Counter(lines)
        views.add(tuple(good))
        data = m.path("c.csv").read_bytes()
        assert len(data) == len(files["c.csv"]) and data.startswith(b"k,v\n") and data.endswith(b"\n500,2")
        assert sorted(data.split(b"\n")) == sorted(files["c.csv"].split(b"\n"))
    if strategy == "none":  # the source order: the source's bytes
        assert m.path("a.jsonl").read_bytes() == files["a.jsonl"]
    elif strategy != "once":
        assert len(views) > 1  # the rest is still shuffled, anew every epoch


@pytest.mark.parametrize("strategy,extra", [("stratified", []), ("full", []), ("block", []),
                                            ("pls", ["--exchange", "0.5"]), ("full", ["--balance"]),
                                            ("corgipile", ["--even", "pad"])])
def test_rank_shares_and_loader_parts_hold_the_torn_line_once_at_the_end_of_the_last(mount, tmp_path, strategy,
                                                                                      extra):
    """Holds: SEMANTICS.md#views-torn, SEMANTICS.md#ranks-share, SEMANTICS.md#ranks-parts"""
    lines = complete(2000)
    files = {"a.jsonl": b"\n".join(lines) + b"\n" + TORN}
    world, parts = 3, 2
    stage = ["--stage-dir", str(tmp_path / "stage")] if strategy == "pls" else []
    first = mount(files, *ARGS, "--strategy", strategy, *extra, *stage, "--rank", "0", "--world-size", str(world))
    ranks = [first] + [mount(None, *ARGS, "--strategy", strategy, *extra, *stage, "--rank", str(r),
                             "--world-size", str(world), src=first.src) for r in range(1, world)]
    for epoch in (0, 1):
        whole, parted = collections.Counter(), collections.Counter()
        for r, m in enumerate(ranks):
            m.set_epoch(epoch)
            good, torn = jsonl_loop(m.path("a.jsonl"))
            assert torn == (TORN if r == world - 1 else None), (r, torn)
            whole.update(good)
            for i in range(parts):
                good, torn = jsonl_loop(m.path(f".parts/{parts}/{i}/a.jsonl"))
                assert torn == (TORN if (r, i) == (world - 1, parts - 1) else None), (r, i, torn)
                parted.update(good)
        if "--even" in extra:  # padding repeats some records, never the torn one
            assert set(whole) == set(lines) and set(parted) == set(lines)
        else:
            assert whole == parted == collections.Counter(lines)


def test_pool_members_without_their_last_newline_end_the_last_shard_in_member_order(mount):
    """Holds: SEMANTICS.md#views-torn, SEMANTICS.md#ranks-pools"""
    members = {f"part-{i:05d}.jsonl": complete(300 + 100 * i, f"p{i}") for i in range(4)}
    torn = {"part-00001.jsonl": b'{"src": "p1", "cut', "part-00003.jsonl": b'{"src": "p3", "cut'}
    files = {name: b"\n".join(ls) + b"\n" + torn.get(name, b"") for name, ls in members.items()}
    everything = collections.Counter(x for ls in members.values() for x in ls)
    for strategy in ("stratified", "full"):
        m = mount(files, *ARGS, "--strategy", strategy)
        for epoch in (0, 1, 2):
            m.set_epoch(epoch)
            got = collections.Counter()
            for name in sorted(files):
                data = m.path(name).read_bytes()
                lines = data.split(b"\n")
                cut = [j for j, line in enumerate(lines) if line in torn.values()]
                if name != "part-00003.jsonl":
                    assert not cut and lines[-1] == b"", (name, cut)
                else:  # the last shard ends with the torn lines, in member order, a newline between
                    assert data.endswith(torn["part-00001.jsonl"] + b"\n" + torn["part-00003.jsonl"])
                    lines = lines[:-2]
                got.update(x for x in lines if x)
            assert got == everything
        m.stop()


def test_a_resumed_view_ends_with_the_torn_line(mount, tmp_path):
    """Holds: SEMANTICS.md#views-torn, SEMANTICS.md#resume-same"""
    lines = complete(2000)
    files = {"a.jsonl": b"\n".join(lines) + b"\n" + TORN}
    m = mount(files, *ARGS, "--world-size", "2", "--rank", "1")
    m.set_epoch(3)
    whole, torn = jsonl_loop(m.path("a.jsonl"))
    assert torn == TORN
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"epoch": 3, "views": {"a.jsonl": [{"world_size": 2, "parts": 1,
                                                                     "consumed": [[100], [400]]}]}}))
    r = shufflefs("epoch", m.path(), 3, "--resume", state)
    assert r.returncode == 0, r.stderr
    rest, torn = jsonl_loop(m.path("a.jsonl"))
    assert torn == TORN and rest == whole[400:]


def test_an_append_while_mounted_shows_the_finished_line_as_a_record(mount):
    """Holds: SEMANTICS.md#views-torn, SEMANTICS.md#changes-new-open"""
    lines = complete(1500)
    m = mount({"log.jsonl": b"\n".join(lines) + b"\n"}, *ARGS, "--strategy", "full")
    src = m.src / "log.jsonl"
    with open(src, "ab") as f:  # a writer half way through a line
        f.write(TORN)
    good, torn = jsonl_loop(m.path("log.jsonl"))
    assert torn == TORN and collections.Counter(good) == collections.Counter(lines)
    finished = TORN + b'ten"}'
    with open(src, "ab") as f:
        f.write(b'ten"}\n')
    places = []
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        good, torn = jsonl_loop(m.path("log.jsonl"))
        assert torn is None and collections.Counter(good) == collections.Counter(lines + [finished])
        assert os.stat(m.path("log.jsonl")).st_size == src.stat().st_size
        places.append(good.index(finished))
    assert places != [len(lines)] * 3  # shuffled like any other record, no longer kept last


def test_a_mixture_gives_the_torn_lines_it_takes_at_the_end_of_its_last_shard(mount, tmp_path):
    """Holds: SEMANTICS.md#views-torn, SEMANTICS.md#mix-files"""
    web = {f"web/w{i}.jsonl": b"\n".join(complete(400, f"w{i}")) + b"\n" + b'{"src": "w%d", "cut' % i
           for i in range(2)}
    books = {"books/b.jsonl": b"\n".join(complete(300, "b")) + b"\n"}
    config = tmp_path / "mix.toml"
    config.write_text('[[mix]]\nname = "blend"\nsamples = 1400\nshards = 3\n'
                      '[[mix.source]]\nglob = "web/*.jsonl"\nweight = 3\n[[mix.source]]\nglob = "books/*.jsonl"\n'
                      'weight = 1\n')
    m = mount({**web, **books}, *ARGS, "--strategy", "full", "--config", str(config))
    cut = {b'{"src": "w0", "cut', b'{"src": "w1", "cut'}
    for epoch in (0, 1, 2):  # 1,050 of 802 web records: every web record once, some twice
        m.set_epoch(epoch)
        names = sorted(os.listdir(m.path(".mix/blend")))
        views = [m.path(f".mix/blend/{n}").read_bytes() for n in names]
        blend = b"".join(views)
        for v in views[:-1]:
            assert v.endswith(b"\n") and not cut & set(v.split(b"\n"))
        lines = blend.split(b"\n")
        torn = [j for j, line in enumerate(lines) if line in cut]
        assert torn == list(range(len(lines) - len(torn), len(lines))) and len(torn) >= 2, torn
        assert lines[-len(torn):] == sorted(lines[-len(torn):])  # in source order
        assert len(lines) == 1400 and all(json.loads(x) for x in lines[:-len(torn)])
