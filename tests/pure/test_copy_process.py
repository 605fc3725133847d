"""Level: pure (no FUSE; a real child process).

A background decoded copy is decoded by a child process of the mount (`stages.copy_process`), so
that the views' own decoding keeps the interpreter: the child writes exactly the decoded bytes,
checks every checksum, tells a damaged stream from a changed file, and is killed when the mount
stops or dies."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from conftest import children_of, process_gone
from shufflefs.errors import FormatError, StaleSourceError
from shufflefs.stages.copy_process import decode_in_child

PLAIN = b"".join(b'{"i": %d, "text": "%s"}\n' % (i, b"abc" * (i % 50)) for i in range(60000))


def copiers(pid: int) -> list[int]:
    return children_of(pid, b"copy_process")


def decode(tmp_path: Path, blob: bytes, codec: str, stopping=lambda: False) -> tuple[int | None, bytes]:
    src = tmp_path / "src"
    src.write_bytes(blob)
    fd = os.open(src, os.O_RDONLY)
    try:
        with open(tmp_path / "copy", "w+b") as out:
            got = decode_in_child(fd, len(blob), codec, out, str(tmp_path), str(src), 10, stopping)
        return got, (tmp_path / "copy").read_bytes()
    finally:
        os.close(fd)


@pytest.mark.parametrize("codec,blob", [
    ("gzip", gzip.compress(PLAIN[:900_000]) + gzip.compress(PLAIN[900_000:])),
    ("zstd", b"".join(zstandard.ZstdCompressor(write_checksum=True).compress(PLAIN[i: i + 300_000])
                      for i in range(0, len(PLAIN), 300_000))),
])
def test_the_child_writes_the_decoded_bytes(tmp_path, codec, blob):
    got, copy = decode(tmp_path, blob, codec)
    assert got == len(PLAIN) and copy == PLAIN
    assert copiers(os.getpid()) == []


def test_a_damaged_stream_and_a_changed_file_are_told_apart(tmp_path):
    blob = gzip.compress(PLAIN)
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(FormatError, match="src"):
        decode(tmp_path, bytes(bad), "gzip")
    zst = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(PLAIN))
    zst[-2] ^= 0xFF  # the content checksum
    with pytest.raises(FormatError):
        decode(tmp_path, bytes(zst), "zstd")
    src = tmp_path / "src"
    src.write_bytes(blob[: len(blob) // 2])  # shorter than the size it was indexed at
    fd = os.open(src, os.O_RDONLY)
    try:
        with open(tmp_path / "copy", "w+b") as out, pytest.raises(StaleSourceError, match="ends before"):
            decode_in_child(fd, len(blob), "gzip", out, str(tmp_path), str(src), 10, lambda: False)
    finally:
        os.close(fd)
    assert copiers(os.getpid()) == []


def test_stopping_kills_the_child(tmp_path):
    """The stop is seen at the first poll; the stream (200 members, 1.2 GB decoded) takes seconds
    to decode, where one 236 MB member once ended before a stop 0.3 s in was seen."""
    blob = gzip.compress(PLAIN) * 200
    t0 = time.monotonic()
    got, copy = decode(tmp_path, blob, "gzip", stopping=lambda: True)
    assert got is None and time.monotonic() - t0 < 5
    assert len(copy) < 200 * len(PLAIN)
    assert copiers(os.getpid()) == []


def test_the_child_runs_niced_and_dies_with_its_parent(tmp_path):
    """A parent killed with SIGKILL (no handler runs) takes its child with it."""
    src = tmp_path / "src"
    src.write_bytes(gzip.compress(PLAIN * 80))
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, sys
from shufflefs.stages.copy_process import decode_in_child
fd = os.open({str(src)!r}, os.O_RDONLY)
with open({str(tmp_path / 'copy')!r}, "w+b") as out:
    decode_in_child(fd, os.fstat(fd).st_size, "gzip", out, {str(tmp_path)!r}, "src", 10, lambda: False)
"""], env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    try:
        deadline = time.monotonic() + 20
        while not (kids := copiers(parent.pid)):
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        child = kids[0]
        while os.getpriority(os.PRIO_PROCESS, child) != 10:  # its first step
            assert time.monotonic() < deadline, "the child never lowered its priority"
            time.sleep(0.05)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not process_gone(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
