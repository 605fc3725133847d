"""A byte range reader as a seekable file: what the decoding libraries read a source through."""

from __future__ import annotations

import io
from typing import Callable

Read = Callable[[int, int], bytes]


def read_full(reader: object, out: memoryview, ended: Callable[[int], str]) -> None:
    """``out`` filled by ``reader.readinto`` (a decoder's stream, which gives what it has at a
    time); EOFError saying ``ended(bytes read)`` if the stream ends first."""
    done = 0
    while done < len(out):
        n = reader.readinto(out[done:])  # type: ignore[attr-defined]
        if not n:
            raise EOFError(ended(done))
        done += n


class RangeFile(io.RawIOBase):
    """A read-only seekable file of ``size`` bytes read through ``read(start, end)`` (a source's
    `read_range`, which checks the source's version on every read; a mapped file's slices)."""

    def __init__(self, read: Read, size: int, progress: Callable[[int], None] | None = None) -> None:
        self._read, self.size, self.pos, self.progress = read, size, 0, progress

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, out: object) -> int:
        out = memoryview(out).cast("B")
        end = min(self.size, self.pos + len(out))
        if end <= self.pos:
            return 0
        got = self._read(self.pos, end)
        out[: len(got)] = got
        self.pos += len(got)
        if self.progress is not None:
            self.progress(self.pos)
        return len(got)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos
