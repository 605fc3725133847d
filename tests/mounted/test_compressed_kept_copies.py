"""Level: mounted (real FUSE mounts, real readers).

Decoded copies kept across mounts: at unmount a mount's finished copies of compressed files stay
on the node-local disk (``kept-copies`` under the stage or cache directory), and a later mount of
the same files takes them, so its first epoch reads a copy instead of decoding from restart
points.  A source changed in between, or a kept copy changed on disk, is never read: the view
decodes as without one, and holds the same bytes either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compressed_files as cf

FILES = {"train.jsonl.gz": lambda d: cf.gz(d, members=3), "frames.jsonl.zst": lambda d: cf.zst(d, frame=1 << 20),
         "one.jsonl.zst": lambda d: cf.zst(d)}


def info(m, name: str) -> dict:
    return json.loads(m.xattr("info", name))["compressed"]


def kept(cache: Path) -> list[Path]:
    return sorted((cache / "kept-copies").glob("*")) if (cache / "kept-copies").is_dir() else []


@pytest.fixture(scope="module")
def plain() -> bytes:
    return cf.jsonl(12000, seed=7)


def first_mount(mount, files: dict, *args: str):
    """A mount that indexes ``files`` (its scans write their copies), read once and unmounted."""
    m = mount(files, *args)
    got = {name: m.path(name).read_bytes() for name in files}
    m.stop()
    assert m.returncode == 0, m.stderr()
    return m, got


def test_a_later_mount_reads_the_copies_the_first_one_kept(mount, plain: bytes):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#views-order"""
    files = {name: encode(plain) for name, encode in FILES.items()}
    first, epoch0 = first_mount(mount, files, "--seed", "4")
    assert len(kept(first.cache)) == len(files)
    later = mount(None, "--seed", "4", "--cache-dir", str(first.cache), src=first.src)
    needed = mount(files, "--seed", "4", "--decoded-copies", "needed")
    for name in files:
        got = info(later, name)
        assert got["read_from"] == "a decoded copy", got
        if name != "one.jsonl.zst":  # (whose info says why it is read from a copy at all)
            assert "earlier mount" in got["copied_because"], got
        assert later.path(name).read_bytes() == epoch0[name] == needed.path(name).read_bytes()
        for m in (later, needed):
            m.set_epoch(1, name)
        assert later.path(name).read_bytes() == needed.path(name).read_bytes() != epoch0[name]
    assert kept(first.cache) == []  # taken, not shared
    stats = later.stats()
    assert stats["decoded"]["being_made"] == [] and stats["decoded"]["queued"] == []  # nothing decoded again
    made = {Path(p).name: c["made"] for p, c in stats["decoded_copies"].items()}
    assert all(v.startswith("by an earlier mount") for v in made.values()) and len(made) == len(files), made
    later.stop()
    assert later.returncode == 0 and len(kept(first.cache)) == len(files)  # kept again for the next


def test_a_changed_source_or_kept_copy_is_not_read(mount, plain: bytes):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#changes-new-open"""
    files = {"a.jsonl.gz": cf.gz(plain), "b.jsonl.gz": cf.gz(plain[: len(plain) // 2])}
    first, epoch0 = first_mount(mount, files, "--seed", "1")
    assert len(kept(first.cache)) == 2
    new = cf.jsonl(5000, seed=8)
    (first.src / "a.jsonl.gz").write_bytes(cf.gz(new))  # a new version of a
    b_copy = next(p for p in kept(first.cache)
                  if p.stat().st_size == len(plain[: len(plain) // 2]))
    with open(b_copy, "r+b") as f:  # b's copy damaged on disk, its size kept
        f.seek(100)
        f.write(b"X" * 16)
    os.utime(b_copy, ns=(b_copy.stat().st_atime_ns, b_copy.stat().st_mtime_ns + 1))
    later = mount(None, "--seed", "1", "--cache-dir", str(first.cache), src=first.src)
    a = later.path("a.jsonl.gz").read_bytes()
    assert sorted(cf.lines_of(cf.decode("a.gz", a))) == sorted(cf.lines_of(new))
    b = later.path("b.jsonl.gz").read_bytes()
    assert b == epoch0["b.jsonl.gz"]  # decoded again, not read from the damaged copy
    assert b"X" * 16 not in cf.decode("b.gz", b)
    assert "changed since it was kept" in later.stderr()
    before = kept(first.cache)
    assert later.stats()["decoded"]["kept_for_later_mounts"]["files"] == len(before) == 1  # a's old version's
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(later.path())], capture_output=True,
                         text=True, timeout=60).stdout
    assert "1 kept from earlier mounts" in out, out
    deadline = time.monotonic() + 60  # b's copy, made again in the background: an unmount stops it unfinished
    while later.stats()["decoded"]["being_made"]:
        assert time.monotonic() < deadline, later.stats()["decoded"]
        time.sleep(0.1)
    later.stop()
    after = kept(first.cache)
    assert len(after) == 2 and not set(before) & set(after), (before, after)  # a's old copy replaced
    assert sorted(p.stat().st_size for p in after) == sorted([len(new), len(plain[: len(plain) // 2])])
