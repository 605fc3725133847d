"""Level: mounted (real FUSE mounts, real readers).

Background decoded copies (``--decoded-copies auto``, the default): a compressed file read from
restart points (its index cached, so no scan wrote a copy) is decoded into a copy on node-local
disk while its first views are read, and the views opened once it is there read the copy.  Where the bytes come from never changes which bytes
a view holds: the same epochs read the same through a mount that never copies (``needed``).  A
rewrite is ESTALE for handles opened before and the new version for new opens, as without a
copy; an unmount stops a copy under way and leaves nothing behind."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compressed_files as cf
from conftest import children_of, process_gone

FILES = {"train.jsonl.gz": lambda d: cf.gz(d, members=3), "frames.jsonl.zst": lambda d: cf.zst(d, frame=1 << 20),
         "padded.jsonl.gz": lambda d: cf.gz(d) + bytes(70000)}  # zero padding after the member: not decoded
COPY_TIMEOUT = 60.0


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def compressed_info(m, name: str) -> dict:
    return json.loads(m.xattr("info", name))["compressed"]


def wait_for_copy(m, name: str) -> dict:
    """The view's ``compressed`` info once it reads a decoded copy (its first open started it)."""
    deadline = time.monotonic() + COPY_TIMEOUT
    while True:
        info = compressed_info(m, name)
        if info["read_from"] == "a decoded copy":
            return info
        assert "none" not in info.get("decoded_copy", ""), info  # refused: there is room on this disk
        assert time.monotonic() < deadline, f"no decoded copy of {name} after {COPY_TIMEOUT} s: {info}"
        time.sleep(0.1)


def later_mount(mount, files: dict, *args: str):
    """A mount of ``files`` with ``args`` that finds every file's index cached (built by a mount of
    the same tree that writes no copies), so that its copies are made in the background, as on
    any later mount."""
    first = mount(files, *args, "--decoded-copies", "needed")
    for name in files:
        first.path(name).stat()
    later = mount(None, *args, "--cache-dir", str(first.cache), src=first.src)
    later.cache = first.cache  # the cache directory it was given (the last --cache-dir counts)
    return later


@pytest.fixture(scope="module")
def plain() -> bytes:
    return cf.jsonl(30000, seed=11)


def test_views_read_a_copy_made_in_the_background_and_hold_the_same_bytes(mount, plain: bytes):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#views-order"""
    files = {name: encode(plain) for name, encode in FILES.items()}
    auto = later_mount(mount, files, "--seed", "3")
    needed = mount(files, "--seed", "3", "--decoded-copies", "needed")
    for name in files:
        before = compressed_info(auto, name)
        assert before["read_from"] == "restart points" and before["restart_points"] >= 2, before
        first = read(auto.path(name))  # epoch 0 from restart points; its open starts the copy
        info = wait_for_copy(auto, name)
        assert "background" in info["copied_because"] and info["copy_dir"], info
        assert first == read(needed.path(name))
        for m in (auto, needed):
            m.set_epoch(1, name)
        got = read(auto.path(name))  # from the copy
        assert got == read(needed.path(name)) and got != first
        assert sorted(cf.lines_of(cf.decode(name, got))) == sorted(cf.lines_of(plain))
        assert compressed_info(needed, name)["read_from"] == "restart points"
    stats = auto.stats()
    assert sorted(Path(p).name for p in stats["decoded_copies"]) == sorted(files)
    assert stats["decoded"]["background"] is True and stats["decoded"]["being_made"] == []
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(auto.path())], capture_output=True,
                         text=True, timeout=60).stdout
    assert "decoded copy" in out and "train.jsonl.gz" in out
    assert not needed.stats().get("decoded_copies")


def test_a_rewrite_after_the_copy_is_estale_for_open_handles_and_new_for_new_opens(mount, plain: bytes):
    """Holds: SEMANTICS.md#changes-open-estale, SEMANTICS.md#changes-new-open, SEMANTICS.md#views-compressed-copy"""
    name = "train.jsonl.gz"
    m = mount({name: cf.gz(plain)})
    read(m.path(name))
    wait_for_copy(m, name)
    m.set_epoch(1, name)  # a view none of whose pages the kernel has cached: every read asks the daemon
    with open(m.path(name), "rb") as held:
        new = cf.jsonl(20000, seed=12)
        tmp = m.src / (name + ".tmp")
        tmp.write_bytes(cf.gz(new))
        os.replace(tmp, m.src / name)
        with pytest.raises(OSError) as e:
            held.read()
        assert e.value.errno == errno.ESTALE
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = read(m.path(name))
        if sorted(cf.lines_of(cf.decode(name, got))) == sorted(cf.lines_of(new)):
            break
        time.sleep(0.2)  # the listing's lifetime
    else:
        pytest.fail("new opens never showed the new version")
    info = wait_for_copy(m, name)  # the new version gets a copy of its own
    assert info["decoded_bytes"] == len(new)


def test_an_unmount_stops_a_copy_under_way_and_leaves_nothing(mount):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    big = {"big.jsonl.gz": cf.gz(cf.jsonl(100000, seed=13))}  # about 78 MB decoded: its copy takes a while
    m = later_mount(mount, big)
    with open(m.path("big.jsonl.gz"), "rb") as f:
        f.read(1 << 20)
    t0 = time.monotonic()
    m.stop()
    assert m.returncode == 0 and time.monotonic() - t0 < 30
    left = list(m.cache.glob(f"decoded-{m.pid}-*"))  # (the first mount, still up, has its own)
    assert not left, left


def test_a_copy_is_decoded_by_a_child_that_goes_with_a_killed_daemon(mount):
    """The background copy is decoded by a child process (the views' decoding keeps the daemon's
    interpreter), niced, and a daemon killed with SIGKILL takes it along.
    Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#umount-killed"""
    m = later_mount(mount, {"big.jsonl.gz": cf.gz(cf.jsonl(100000, seed=14))})
    with open(m.path("big.jsonl.gz"), "rb") as f:
        f.read(1 << 20)
    deadline = time.monotonic() + COPY_TIMEOUT
    while not (kids := children_of(m.pid, b"copy_process")):
        assert compressed_info(m, "big.jsonl.gz")["read_from"] == "restart points", "copied without a child"
        assert time.monotonic() < deadline, "no child decodes the copy"
        time.sleep(0.02)
    assert os.getpriority(os.PRIO_PROCESS, kids[0]) > os.getpriority(os.PRIO_PROCESS, m.pid)
    os.kill(m.pid, signal.SIGKILL)
    m.wait()
    subprocess.run(["fusermount3", "-u", "-z", str(m.mnt)], capture_output=True, timeout=30)
    while not process_gone(kids[0]):
        assert time.monotonic() < deadline + 10, "the child outlived the daemon"
        time.sleep(0.05)


def test_a_pool_of_many_shards_gets_its_copies_one_after_another(mount):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#ranks-pools"""
    n = 12
    shards = {f"train-{i:05d}-of-{n:05d}.jsonl.gz": cf.gz(cf.jsonl(3000, seed=20 + i)) for i in range(n)}
    every = sorted(line for body in shards.values() for line in cf.lines_of(cf.decode("x.gz", body)))
    auto = later_mount(mount, shards, "--seed", "2")
    needed = mount(shards, "--seed", "2", "--decoded-copies", "needed")

    def epoch(m) -> list[bytes]:
        return [m.path(name).read_bytes() for name in sorted(shards)]

    first = epoch(auto)  # opens every member: their copies are queued
    assert first == epoch(needed)
    assert sorted(line for b in first for line in cf.lines_of(cf.decode("x.gz", b))) == every
    deadline = time.monotonic() + COPY_TIMEOUT
    while True:
        got = auto.stats().get("decoded", {})
        if got.get("files") == n and not got.get("being_made") and not got.get("queued"):
            break
        assert len(got.get("being_made", [])) <= 1, got  # one copy at a time
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    for m in (auto, needed):
        m.set_epoch(1)
    assert epoch(auto) == epoch(needed) != first


def test_a_pool_of_single_frame_shards_is_read_from_their_copies(mount):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#ranks-pools"""
    n = 4
    shards = {f"train-{i:05d}-of-{n:05d}.jsonl.zst": cf.zst(cf.jsonl(50000, seed=40 + i)) for i in range(n)}
    every = sorted(line for body in shards.values() for line in cf.lines_of(cf.decode("x.zst", body)))
    m = mount(shards, "--seed", "2", "--decoded-copies", "needed")
    got = [m.path(name).read_bytes() for name in sorted(shards)]
    assert sorted(line for b in got for line in cf.lines_of(cf.decode("x.zst", b))) == every
    assert m.stats()["decoded"]["files"] == n
