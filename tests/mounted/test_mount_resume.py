"""Level: mounted (real FUSE mounts, real readers, the real command).

Resuming an epoch after a stop (``shufflefs epoch MNT E --resume STATE``): on the same layout
every rank's view is byte for byte the rest of its uninterrupted view; on other layouts, chained,
what every layout consumed plus what the last one serves is every record exactly once.
"""

from __future__ import annotations

import collections
import errno
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_mount import ARGS, RECORD, jsonl, lines

EPOCH = 3
N_LINES = 1500


def fixed(n: int) -> bytes:
    return b"".join(struct.pack("<I", i).ljust(RECORD, b"r") for i in range(n))


def split(data: bytes, rel: str) -> list[bytes]:
    """The records of a view in order."""
    if rel.endswith(".bin"):
        return [data[i: i + RECORD] for i in range(0, len(data), RECORD)]
    return data.splitlines(keepends=True)


def source_records(path: Path, rel: str) -> collections.Counter:
    data = path.read_bytes()
    return collections.Counter(split(data, rel)) if rel.endswith(".bin") else lines(data)


def shufflefs(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def resume(mounts, state: dict, tmp: Path, name: str) -> None:
    f = tmp / f"{name}.json"
    f.write_text(json.dumps(state))
    for m in mounts:
        r = shufflefs("epoch", m.path(), state["epoch"], "--resume", f)
        assert r.returncode == 0, r.stderr


def streams(mounts, rel: str, parts: int) -> list[list[bytes]]:
    """Every (rank, part) view's records, rank-major."""
    out = []
    for m in mounts:
        for i in range(parts):
            p = m.path(rel) if parts == 1 else m.path(f".parts/{parts}/{i}/{rel}")
            out.append(split(p.read_bytes(), rel))
    return out


def ranks(mount, files, world: int, *args: str, src=None) -> list:
    return ranks_of(mount, files, world, [*ARGS, *args], src=src)


def ranks_of(mount, files, world: int, args: list[str], src=None) -> list:
    """``world`` mounts of one source, rank 0 first."""
    first = mount(files, *args, "--rank", "0", "--world-size", str(world), src=src)
    return [first] + [mount(None, *args, "--rank", str(r), "--world-size", str(world), src=first.src)
                      for r in range(1, world)]


FILES = {"a.jsonl": jsonl(N_LINES, 5), "d/b.bin": fixed(1100)}


@pytest.mark.parametrize("strategy", ["stratified", "full", "lirs-page", "pls"])
def test_same_layout_goes_on_where_each_view_stopped(mount, tmp_path, strategy):
    """Holds: SEMANTICS.md#resume-same"""
    args = ["--strategy", strategy] + (["--exchange", "0.3"] if strategy == "pls" else [])
    ms = ranks(mount, FILES, 2, *args)
    for m in ms:
        m.set_epoch(EPOCH)
    whole = {rel: streams(ms, rel, 1) for rel in FILES}
    consumed = {"a.jsonl": [[517], [0]], "d/b.bin": [[3], [len(whole["d/b.bin"][1])]]}
    state = {"epoch": EPOCH, "views": {rel: [{"world_size": 2, "parts": 1, "consumed": c}] for rel, c in consumed.items()}}
    resume(ms, state, tmp_path, "s1")
    for rel in FILES:
        for r, m in enumerate(ms):
            got = m.path(rel).read_bytes()
            assert got == b"".join(whole[rel][r][consumed[rel][r][0]:]), f"{rel} rank {r}"
            assert os.stat(m.path(rel)).st_size == len(got)
    info = json.loads(ms[0].xattr("info", "a.jsonl"))
    assert info["resumed"] is True and info["view_records"] == len(whole["a.jsonl"][0]) - 517
    assert json.loads(ms[0].xattr("resume"))["epoch"] == EPOCH
    assert json.loads(ms[0].xattr("stats"))["resume"] == {"epoch": EPOCH, "views": sorted(FILES)}
    r = shufflefs("stat", ms[0].path())
    assert r.returncode == 0 and f"epoch {EPOCH} resumed after a stop: 2 view(s)" in r.stdout, r.stdout


@pytest.mark.parametrize("args", [
    ["--strategy", "stratified"],
    ["--strategy", "full", "--balance"],
    ["--strategy", "corgipile", "--even", "pad"],
    ["--strategy", "pls", "--exchange", "0.5", "--stage-dir", "{stage}"],
    ["--strategy", "pls", "--exchange", "0.5"],
    ["--strategy", "lirs-page", "--even", "drop"],
], ids=["stratified", "balance", "even-pad", "pls-staged", "pls", "lirs-page-even-drop"])
def test_a_chain_of_layouts_serves_every_record_exactly_once(mount, tmp_path, args):
    """2 ranks stop mid-epoch, 3 ranks of 2 loader parts resume and stop, 1 rank finishes: the
    records each layout consumed and the last one's views are the epoch's records, once each.

    Holds: SEMANTICS.md#resume-once, SEMANTICS.md#resume-other"""
    args = [a.replace("{stage}", str(tmp_path / "stage")) for a in args]
    rng = np.random.default_rng(1)
    two = ranks(mount, FILES, 2, *args)
    for m in two:
        m.set_epoch(EPOCH)
    epoch_records = {rel: collections.Counter(r for s in streams(two, rel, 1) for r in s) for rel in FILES}
    taken = {rel: collections.Counter() for rel in FILES}
    layouts: dict[str, list] = {rel: [] for rel in FILES}

    def stop(mounts, parts: int) -> None:
        for rel in FILES:
            shown = streams(mounts, rel, parts)
            counts = [int(rng.integers(0, len(s) + 1)) for s in shown]
            for s, c in zip(shown, counts):
                taken[rel].update(s[:c])
            layouts[rel].append({"world_size": len(mounts), "parts": parts,
                                 "consumed": [counts[r * parts: (r + 1) * parts] for r in range(len(mounts))]})

    stop(two, 1)
    three = ranks(mount, None, 3, *args, src=two[0].src)
    resume(three, {"epoch": EPOCH, "views": layouts}, tmp_path, "s2")
    stop(three, 2)
    one = ranks(mount, None, 1, *args, src=two[0].src)
    resume(one, {"epoch": EPOCH, "views": layouts}, tmp_path, "s3")
    for rel in FILES:
        served = collections.Counter(r for s in streams(one, rel, 1) for r in s)
        assert taken[rel] + served == epoch_records[rel], rel
        if "--even" not in args:  # every source record once (pad repeats some in the epoch itself)
            assert epoch_records[rel] == source_records(two[0].src / rel, rel)


def test_pool_shards_resume_each_on_their_own(mount, tmp_path):
    """A pool's shards are separate views in the state (loaders read shards in their own order);
    a shard the state does not name follows its siblings' layouts.

    Holds: SEMANTICS.md#resume-once"""
    shards = {f"p/part-{i:05d}.jsonl": jsonl(300 + 50 * i, i) for i in range(3)}
    two = ranks(mount, shards, 2, "--strategy", "stratified")
    for m in two:
        m.set_epoch(EPOCH)
    whole = {rel: streams(two, rel, 1) for rel in shards}
    views = {rel: [{"world_size": 2, "parts": 1, "consumed": [[k * 40], [7 * k]]}] for k, rel in enumerate(shards)}
    del views["p/part-00002.jsonl"]  # consumed nothing
    one = ranks(mount, None, 1, "--strategy", "stratified", src=two[0].src)
    resume(one, {"epoch": EPOCH, "views": views}, tmp_path, "s")
    served = collections.Counter()
    for rel in shards:
        rest = streams(one, rel, 1)[0]
        served.update(rest)
        firsts = [c[0] for c in views[rel][0]["consumed"]] if rel in views else [0, 0]
        # one rank after two: each shard goes on with the rests of its two views, in rank order
        assert rest == [r for s, c in zip(whole[rel], firsts) for r in s[c:]], rel
    consumed = collections.Counter(r for rel in views for s, c in zip(whole[rel], views[rel][0]["consumed"])
                                   for r in s[:c[0]])
    pool = sum((lines(two[0].src.joinpath(rel).read_bytes()) for rel in shards), collections.Counter())
    assert consumed + served == pool


def test_an_npy_view_resumes_with_a_header_of_its_rows(mount, tmp_path):
    arr = np.arange(4000 * 3, dtype=np.float32).reshape(4000, 3)
    src = tmp_path / "npysrc"
    src.mkdir()
    np.save(src / "x.npy", arr)
    m = mount(None, "--strategy", "stratified", "--block-size", "4KiB", "--buffer", "32KiB", src=src)
    m.set_epoch(EPOCH)
    whole = np.load(m.path("x.npy"))
    resume([m], {"epoch": EPOCH, "views": {"x.npy": [{"world_size": 1, "parts": 1, "consumed": [[1234]]}]}},
           tmp_path, "s")
    got = np.load(m.path("x.npy"))
    assert got.shape == (4000 - 1234, 3) and np.array_equal(got, whole[1234:])


def test_bad_states_are_refused_and_the_next_epoch_clears_a_state(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-errors, SEMANTICS.md#resume-clear"""
    m = mount({"a.jsonl": jsonl(400, 2)}, *ARGS)
    bad = tmp_path / "bad.json"
    for text, message in [("{", "not JSON"), ('{"epoch": 4, "views": {}}', "a state of epoch 4, not 3"),
                          ('{"epoch": 3, "views": {"a.jsonl": [{"world_size": 2, "consumed": [[1]]}]}}', "list of 2 lists")]:
        bad.write_text(text)
        r = shufflefs("epoch", m.path(), EPOCH, "--resume", bad)
        assert r.returncode == 2 and message in r.stderr, r.stderr
    r = shufflefs("epoch", m.path("a.jsonl"), EPOCH, "--resume", bad)
    assert r.returncode == 2 and "mount's root" in r.stderr
    for value in [b"{nonsense", b'{"epoch": -1, "views": {}}', b"@relative/path", b"@/nonexistent/state.json", b"@/dev/zero"]:
        with pytest.raises(OSError) as e:
            os.setxattr(m.path(), "user.shufflefs.resume", value)
        assert e.value.errno == errno.EINVAL, value
    with pytest.raises(OSError) as e:
        os.setxattr(m.path("a.jsonl"), "user.shufflefs.resume", b'{"epoch": 3, "views": {}}')
    assert e.value.errno == errno.EPERM
    assert "invalid resume state" in m.stderr()

    # counts past a view's end: that view is EINVAL (its size comes from its plan, so a lookup
    # already fails), with a log line and an entry in the mount's errors naming it
    over = {"epoch": EPOCH, "views": {"a.jsonl": [{"world_size": 1, "parts": 1, "consumed": [[401]]}]}}
    big = tmp_path / "big.json"
    big.write_text(json.dumps(over))
    assert shufflefs("epoch", m.path(), EPOCH, "--resume", big).returncode == 0
    with pytest.raises(OSError) as e:
        m.path("a.jsonl").read_bytes()
    assert e.value.errno == errno.EINVAL
    assert any("a.jsonl" in e and "resume state does not fit" in e for e in m.stats()["last_errors"])
    assert "resume state does not fit" in m.stderr()

    # a state given as a file path (large states), then `epoch next` clears it
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"epoch": EPOCH, "views": {"a.jsonl": [{"world_size": 1, "parts": 1, "consumed": [[100]]}]}}))
    os.setxattr(m.path(), "user.shufflefs.resume", b"@" + os.fsencode(ok))
    assert len(split(m.path("a.jsonl").read_bytes(), "a.jsonl")) == 300
    m.set_epoch(EPOCH, "a.jsonl")  # a file's own epoch takes it out of the state
    assert len(split(m.path("a.jsonl").read_bytes(), "a.jsonl")) == 400
    os.setxattr(m.path(), "user.shufflefs.resume", b"@" + os.fsencode(ok))  # a state again: a view of its own
    assert len(split(m.path("a.jsonl").read_bytes(), "a.jsonl")) == 300
    r = shufflefs("epoch", m.path(), "next")
    assert r.returncode == 0 and r.stdout.strip() == str(EPOCH + 1)
    assert len(split(m.path("a.jsonl").read_bytes(), "a.jsonl")) == 400
    with pytest.raises(OSError) as e:
        os.getxattr(m.path(), "user.shufflefs.resume")
    assert e.value.errno == errno.ENODATA
    m.set_epoch(EPOCH)  # the epoch again, without the state: the whole view
    assert len(split(m.path("a.jsonl").read_bytes(), "a.jsonl")) == 400


def tar_keys(data: bytes) -> list[str]:
    """The samples of a tar view in order: runs of members sharing a key (the name before its suffix)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        names = [m.name for m in t.getmembers() if m.isreg()]
    keys: list[str] = []
    for name in names:
        key = name.rsplit(".", 1)[0]
        if not keys or keys[-1] != key:
            keys.append(key)
    return keys


def test_tar_shards_resume_as_whole_samples(mount, tmp_path):
    """WebDataset shards in a pool, consumed sample by sample on two ranks, resumed on three:
    every view is a valid tar, and the samples consumed and served are every sample once.

    Holds: SEMANTICS.md#resume-once"""
    tar = pytest.importorskip("test_mount_tar")
    shards = tar.files()
    args = tar.ARGS + ["--strategy", "stratified"]
    two = ranks_of(mount, shards, 2, args)
    for m in two:
        m.set_epoch(EPOCH)
    rng = np.random.default_rng(4)
    views, taken = {}, collections.Counter()
    for rel in shards:
        shown = [tar_keys(m.path(rel).read_bytes()) for m in two]
        counts = [int(rng.integers(0, len(s) + 1)) for s in shown]
        taken.update(k for s, c in zip(shown, counts) for k in s[:c])
        views[rel] = [{"world_size": 2, "parts": 1, "consumed": [[c] for c in counts]}]
    three = ranks_of(mount, None, 3, args, src=two[0].src)
    resume(three, {"epoch": EPOCH, "views": views}, tmp_path, "s")
    served = collections.Counter(k for m in three for rel in shards for k in tar_keys(m.path(rel).read_bytes()))
    everything = collections.Counter(k for rel, data in shards.items() for k in tar_keys(data))
    assert taken + served == everything
