"""The ways the benchmark reads a file front to back, each bounded by a time limit.

* ``1MiB`` / ``128KiB``: ``os.readv`` into one reused buffer (128 KiB is what ``cat`` uses);
* ``loop``: a Python loop over records, what a training script does: ``for line in f`` on a
  binary file for lines, ``f.read(record_size)`` per record for fixed-size records; the file is
  opened with Python's default buffering (``st_blksize`` bytes per read).

A read stops at EOF or once ``max_seconds`` have passed; a stopped read is marked incomplete and
its rate stands for the whole file (extrapolated, and labelled so in the report).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass
class Reading:
    nbytes: int
    records: int | None
    """Records counted by the reader (loops), or None when it read bytes only."""
    seconds: float
    first_s: float
    """From just before ``open`` to the first byte (or first record) in hand."""
    complete: bool


def read_chunks(path: Path, bufsize: int, max_seconds: float) -> Reading:
    buf = bytearray(bufsize)
    view = [buf]
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.readv(fd, view)
        first = time.perf_counter() - t0
        deadline = t0 + max_seconds
        complete = True
        while True:
            n = os.readv(fd, view)
            if not n:
                break
            total += n
            if time.perf_counter() > deadline:
                complete = total >= os.fstat(fd).st_size
                break
    finally:
        os.close(fd)
    return Reading(total, None, time.perf_counter() - t0, first, complete)


def read_lines(path: Path, max_seconds: float) -> Reading:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        first_line = f.readline()
        first = time.perf_counter() - t0
        n = 1 if first_line else 0
        deadline = t0 + max_seconds
        complete = True
        for _line in f:
            n += 1
            if not n & 0xFFF and time.perf_counter() > deadline:
                complete = f.tell() >= os.fstat(f.fileno()).st_size
                break
        nbytes = f.tell()
    return Reading(nbytes, n, time.perf_counter() - t0, first, complete)


def read_records(path: Path, record_size: int, max_seconds: float) -> Reading:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        read = f.read
        rec = read(record_size)
        first = time.perf_counter() - t0
        n = 1 if rec else 0
        deadline = t0 + max_seconds
        complete = True
        while rec:
            rec = read(record_size)
            if rec:
                n += 1
                if not n & 0x3FF and time.perf_counter() > deadline:
                    complete = f.tell() >= os.fstat(f.fileno()).st_size
                    break
        nbytes = f.tell()
    return Reading(nbytes, n, time.perf_counter() - t0, first, complete)


READERS = ("1MiB", "128KiB", "loop")


def reader(name: str, record_size: int | None) -> Callable[[Path, float], Reading]:
    """The read function called ``name``; ``record_size`` None means a lines file."""
    if name == "1MiB":
        return lambda p, t: read_chunks(p, 1 << 20, t)
    if name == "128KiB":
        return lambda p, t: read_chunks(p, 128 << 10, t)
    if name == "loop":
        if record_size is None:
            return read_lines
        return lambda p, t: read_records(p, record_size, t)
    raise ValueError(f"unknown reader {name!r} (choose from {', '.join(READERS)})")


def warm(path: Path) -> None:
    """Bring ``path`` into the page cache."""
    read_chunks(path, 1 << 20, float("inf"))
