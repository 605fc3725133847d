"""A Parquet file without a local descriptor (an object in a bucket) read for its decoded copy by
whole row groups: pyarrow reads a row group as many small reads (each column chunk, each page
header), which over object storage would each be a request; here the row group's bytes
(`SourceFooter.group_spans`) are fetched first by ranged GETs of at most 8 MiB, in flight at
once (`Source.read_runs`: one GET for a row group of up to 8 MiB), and pyarrow's reads are
answered from them.  The footer is read once per copy and kept (its bytes answer pyarrow's reads
of it).  A read outside what was fetched is a ranged GET of its own, counted (`strays`).
Blocking (worker threads), no FUSE.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np

from ..sources.base import Source


class RangedReader(io.RawIOBase):
    """A `Source` of ``size`` bytes as a read-only, seekable file for pyarrow, answered from byte
    ranges held (``pieces``) and otherwise by ``source.read_range``."""

    def __init__(self, source: Source, size: int, pieces: list[tuple[int, bytes | np.ndarray]] | None = None) -> None:
        super().__init__()
        self.source, self.size, self.pos = source, size, 0
        self.pieces: list[tuple[int, memoryview]] = [(a, memoryview(b).cast("B")) for a, b in pieces or []]
        self.strays = 0
        """Reads no piece held: each was a request of its own."""

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` read from the source and held (the footer, read once)."""
        data = self.source.read_range(start, end)
        self.pieces.append((start, memoryview(data).cast("B")))
        return data

    def hold(self, start: int, data: np.ndarray) -> None:
        self.pieces.append((start, memoryview(data).cast("B")))

    def drop(self, start: int) -> None:
        self.pieces = [(a, b) for a, b in self.pieces if a != start]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.size - self.pos))
        if n:
            out = memoryview(b).cast("B")
            for a, piece in self.pieces:
                if a <= self.pos and self.pos + n <= a + len(piece):
                    out[:n] = piece[self.pos - a: self.pos - a + n]
                    break
            else:
                self.strays += 1
                data = self.source.read_range(self.pos, self.pos + n)
                out[: len(data)] = data
                n = len(data)
        self.pos += n
        return n


class Fetched:
    """The footers of a copy's files, read once (by member), and their strays."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tails: dict[int, tuple[int, bytes]] = {}
        self.strays = 0
        self.groups = 0

    def reader(self, member: int, source: Source, size: int) -> RangedReader:
        """A reader of member ``member`` holding its footer if it was read before."""
        with self._lock:
            tail = self.tails.get(member)
        return RangedReader(source, size, [tail] if tail is not None else None)

    def keep_tail(self, member: int, reader: RangedReader) -> None:
        """The footer ``reader`` fetched, kept for the next readers of that member."""
        if reader.pieces:
            a, b = reader.pieces[-1]
            with self._lock:
                self.tails[member] = (a, bytes(b))


def is_remote(source: Source) -> bool:
    """Whether ``source`` (or any member of a pool's) has no local descriptor pyarrow can read."""
    files = getattr(source, "files", None) or [source]
    return any(not isinstance(getattr(f, "fd", None), int) for f in files)


def group_bytes(source: Source, span: tuple[int, int]) -> np.ndarray | None:
    """A row group's bytes ``span`` read by ranged GETs in flight at once; None if the footer
    gave no span (pyarrow's reads are then requests of their own)."""
    a, b = span
    if b <= a:
        return None
    return source.read_runs(np.array([a], np.int64), np.array([b], np.int64))
