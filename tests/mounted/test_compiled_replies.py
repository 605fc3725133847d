"""Reads answered by the compiled replies (`shufflefs.replies`) are the bytes Python would answer,
are refused once the source changes, and stay right while windows are recycled under many readers."""

from __future__ import annotations

import errno
import json
import os
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import zstandard

import compressed_files as cf
from conftest import Mount
from shufflefs.config import parse_buffer, parse_size
from shufflefs.formats import resolve_format, scan_file
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.windows.layout import render

pytestmark = pytest.mark.skipif(
    not __import__("shufflefs.replies", fromlist=["compiled"]).compiled, reason="compiled replies not built")

BLOCK, BUFFER, SEED = "64KiB", "4MiB", 3
ARGS = ["--block-size", BLOCK, "--buffer", BUFFER, "--seed", str(SEED)]


def jsonl(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    widths = rng.integers(0, 120, n)
    return b"".join(json.dumps({"id": i, "label": i * 10 // n, "text": "x" * int(w)}).encode() + b"\n"
                    for i, w in enumerate(widths.tolist()))


def reference(path: Path, strategy: str, epoch: int = 0) -> bytes:
    index = scan_file(path, resolve_format(path.name, [], {}))
    spec = ShuffleSpec(strategy=strategy, seed=SEED, block_size=parse_size(BLOCK), buffer=parse_buffer(BUFFER))
    return render(index, make_plan(index, spec, epoch, 0, 1), path.read_bytes())


def read_all(path: Path, chunk: int) -> bytes:
    parts, buf = [], bytearray(chunk)
    fd = os.open(path, os.O_RDONLY)
    try:
        while n := os.readv(fd, [buf]):
            parts.append(bytes(buf[:n]))
    finally:
        os.close(fd)
    return b"".join(parts)


def replies(m: Mount) -> dict:
    return m.stats()["compiled_replies"]


@pytest.mark.parametrize("strategy", ["stratified", "none", "corgipile", "full", "lirs-page"])
def test_compiled_replies_serve_the_bytes_python_serves(mount, strategy: str):
    """Holds: SEMANTICS.md#views-compiled-replies"""
    files = {"a.jsonl": jsonl(90000, 1)}
    fast = mount(files, *ARGS, "--strategy", strategy)
    slow = mount(files, *ARGS, "--strategy", strategy, "--python-replies")
    want = reference(fast.src / "a.jsonl", strategy)
    for epoch in (0, 1):
        if epoch:
            fast.set_epoch(epoch)
            slow.set_epoch(epoch)
            want = reference(fast.src / "a.jsonl", strategy, epoch)
        assert read_all(fast.path("a.jsonl"), 1 << 20) == want
        assert read_all(slow.path("a.jsonl"), 1 << 20) == want
    got = replies(fast)
    assert got["state"] == "on" and got["replies"] > 0 and got["write_errors"] == 0
    assert got["registered"] == 0  # every handle closed: nothing left registered
    assert replies(slow)["state"] == "off" and replies(slow)["replies"] == 0
    # every read is counted once, wherever it was answered
    assert fast.stats()["bytes_served"] == slow.stats()["bytes_served"] == 2 * len(want)


@pytest.mark.parametrize("threads", ["0", "3"])
def test_random_reads_of_any_size_match(mount, threads: str):
    """Reads as the application issues them (``--direct-io``): inside a window, across window
    ends, past the end of the file; replies written by the receiving thread or by three others."""
    m = mount({"a.jsonl": jsonl(90000, 2)}, *ARGS, "--direct-io", "--reply-threads", threads)
    want = reference(m.src / "a.jsonl", "stratified")
    rng = random.Random(5)
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        for _ in range(3000):
            off = rng.randrange(0, len(want) + 100)
            size = rng.choice([1, 17, 4096, 65536, 200_000, 1 << 20])
            assert os.pread(fd, size, off) == want[off: off + size]
    finally:
        os.close(fd)
    assert replies(m)["replies"] > 1000 and replies(m)["threads"] == int(threads)


def test_a_source_changed_under_a_window_is_refused(mount):
    """Holds: SEMANTICS.md#changes-open-estale"""
    m = mount({"a.jsonl": jsonl(90000, 3)}, *ARGS, "--direct-io")
    want = reference(m.src / "a.jsonl", "stratified")
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == want[:4096]  # Python loads the window and offers it
        before = replies(m)["replies"]
        assert os.pread(fd, 4096, 4096) == want[4096:8192]
        assert replies(m)["replies"] == before + 1  # answered without Python
        with open(m.src / "a.jsonl", "ab") as f:
            f.write(b'{"id": "new"}\n')
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 8192)  # same window, already loaded: refused all the same
        assert e.value.errno in (errno.EIO, errno.ESTALE)
    finally:
        os.close(fd)
    assert replies(m)["stale"] >= 1
    assert any("a.jsonl" in line for line in m.stats()["last_errors"])


def test_many_readers_while_windows_are_recycled(mount):
    """Sixteen threads read two files at random through their own handles, with room for few
    windows: windows are dropped and loaded again under open handles, and every byte is right."""
    files = {"a.jsonl": jsonl(60000, 4), "b.jsonl": jsonl(60000, 5)}
    m = mount(files, "--block-size", "16KiB", "--buffer", "256KiB", "--seed", str(SEED), "--direct-io")
    spec = ShuffleSpec(strategy="stratified", seed=SEED, block_size=16 << 10, buffer=256 << 10)
    want = {}
    for name in files:
        index = scan_file(m.src / name, resolve_format(name, [], {}))
        want[name] = render(index, make_plan(index, spec, 0, 0, 1), (m.src / name).read_bytes())
    errors: list[str] = []

    def reader(k: int) -> None:
        rng = random.Random(k)
        name = "ab"[k % 2] + ".jsonl"
        fd = os.open(m.path(name), os.O_RDONLY)
        try:
            for _ in range(300):
                off = rng.randrange(0, len(want[name]))
                size = rng.choice([512, 8192, 65536, 300_000])
                if os.pread(fd, size, off) != want[name][off: off + size]:
                    errors.append(f"{name} {off} {size}")
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = m.stats()
    assert stats["compiled_replies"]["replies"] > 0
    assert stats["memory"]["loads"] > stats["memory"]["windows"]  # windows were dropped and loaded again


def test_a_source_found_gone_refuses_every_handle(mount):
    """A source whose directory is renamed away (its own inode, ctime included, unchanged) is
    found gone by the next window load of one handle; the windows other handles hold are not
    answered from either (Python refuses every read of it from then)."""
    m = mount({"d/a.jsonl": jsonl(90000, 6)}, *ARGS, "--direct-io")
    want = reference(m.src / "d" / "a.jsonl", "stratified")
    f1, f2 = (os.open(m.path("d/a.jsonl"), os.O_RDONLY) for _ in range(2))
    try:
        for fd in (f1, f2):
            assert os.pread(fd, 4096, 0) == want[:4096]  # both hold window 0, offered
        assert os.pread(f2, 4096, 4096) == want[4096:8192]
        os.rename(m.src / "d", m.src / "e")
        with pytest.raises(OSError):
            os.pread(f1, 4096, len(want) - 4096)  # another window: its load finds the file gone
        with pytest.raises(OSError) as e:
            os.pread(f2, 4096, 8192)  # inside the window f2 holds
        assert e.value.errno in (errno.EIO, errno.ESTALE, errno.ENOENT)
    finally:
        os.close(f1)
        os.close(f2)


@pytest.mark.parametrize("threads", ["0", "2"])
def test_a_zstd_view_is_answered_with_its_block_headers(mount, threads: str):
    """A zstd view frames the plain view in raw blocks (a 3-byte header every 128 KiB): reads
    inside the window a handle reads are answered by the compiled replies, headers included;
    sequential reads of any size and random reads (across block headers and windows, the frame
    header, the last block, past the end) give the bytes Python gives, a gzip view (whose reads
    take checksums) is left to Python, and a source changed under the window is refused.
    Holds: SEMANTICS.md#views-compiled-replies, SEMANTICS.md#views-compressed"""
    plain = jsonl(60000, 8)
    files = {"a.jsonl.zst": cf.zst(plain, frame=1 << 20), "b.jsonl.gz": cf.gz(plain)}
    fast = mount(files, *ARGS, "--direct-io", "--reply-threads", threads)
    slow = mount(files, *ARGS, "--direct-io", "--python-replies")
    want = read_all(slow.path("a.jsonl.zst"), 1 << 20)
    assert sorted(zstandard.ZstdDecompressor().decompressobj().decompress(want).splitlines()) == sorted(
        plain.splitlines())
    for chunk in (1 << 20, 200_000, 131_075, 4096):
        assert read_all(fast.path("a.jsonl.zst"), chunk) == want, chunk
    got = replies(fast)
    assert got["replies"] > 0 and got["write_errors"] == 0
    rng = random.Random(9)
    fd = os.open(fast.path("a.jsonl.zst"), os.O_RDONLY)
    try:
        for _ in range(3000):
            off = rng.choice([rng.randrange(0, len(want) + 100), 14 + rng.randrange(0, len(want) // 131075 + 1) *
                              131075 + rng.randrange(-4, 4)])
            size = rng.choice([1, 2, 3, 5, 4096, 131_075, 200_000, 1 << 20])
            assert os.pread(fd, size, max(0, off)) == want[max(0, off): max(0, off) + size], (off, size)
    finally:
        os.close(fd)
    assert replies(fast)["replies"] > got["replies"] + 1000
    before = replies(fast)["replies"]
    assert read_all(fast.path("b.jsonl.gz"), 1 << 20) == read_all(slow.path("b.jsonl.gz"), 1 << 20)
    assert replies(fast)["replies"] == before  # gzip: Python's
    fd = os.open(fast.path("a.jsonl.zst"), os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 100) == want[100:4196]  # Python loads the window and offers it
        assert os.pread(fd, 4096, 5000) == want[5000:9096]
        assert replies(fast)["replies"] == before + 1
        with open(fast.src / "a.jsonl.zst", "ab") as f:
            f.write(b"\0")
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 10000)
        assert e.value.errno in (errno.EIO, errno.ESTALE)
    finally:
        os.close(fd)
