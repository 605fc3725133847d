"""What every record format provides: a vectorised scan of a file's bytes to a `RecordIndex`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar

import numpy as np

from ..index import RecordIndex

Progress = Callable[[int], None]
"""Called with the number of bytes scanned so far (for progress bars)."""
WindowCheck = Callable[[np.ndarray, np.ndarray, RecordIndex, str], None]
"""``check(window bytes, record ids in window order, index, path)``: raises `FormatError` if a
record in a window just gathered is damaged (a source byte changed after the index was built)."""


class Format(ABC):
    """A record format.  Instances carry their parameters (e.g. record size)."""

    name: ClassVar[str]
    extensions: ClassVar[dict[str, dict]] = {}
    """File suffixes (lower case, with the dot) this format claims, each with the parameters it
    implies; a suffix whose format lacks a required parameter (``.bin`` without a
    ``record_size``) passes through unchanged."""

    def params(self) -> dict:
        """Everything that changes the index; part of the index cache key."""
        return {}

    @abstractmethod
    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        """Index ``data`` (the whole file as a uint8 array, usually an mmap).

        Raises `FormatError` naming ``path`` and the offset of the first bad byte.  The returned
        index has no stamp; the caller adds it.
        """

    def window_check(self) -> WindowCheck | None:
        """What to verify in every window as it is gathered (None: nothing beyond the source's
        identity, which every read checks).  Formats with per-record checksums check them here."""
        return None

    def view_size(self, size: int, last_byte: int | None) -> int:
        """Size of the view for a source of ``size`` bytes ending in ``last_byte`` (None if empty).

        Cheap, so that getattr never needs the index.  Only line formats differ from ``size``.
        """
        return size

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}({args})"


# --------------------------------------------------------------------------- helpers for scans

SCAN_CHUNK = 4 << 20
"""Bytes compared per step: small enough that the temporaries stay in cache (measured ~2x faster
than 64 MiB steps), large enough that per-step overhead is negligible."""

PROGRESS_EVERY = 64 << 20


def as_bytes(data: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    """A plain 1-d uint8 ndarray over ``data`` without copying (np.memmap ufuncs are slower)."""
    arr = np.asarray(data) if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise TypeError("scan expects a 1-d uint8 array")
    return arr


def iter_chunks(data: np.ndarray, progress: Progress | None, chunk: int = SCAN_CHUNK):
    """Yield ``(offset, data[offset:offset+chunk])``, reporting progress about every 64 MiB."""
    size = len(data)
    reported = 0
    for start in range(0, size, chunk):
        yield start, data[start : start + chunk]
        done = min(start + chunk, size)
        if progress is not None and (done - reported >= PROGRESS_EVERY or done == size):
            progress(done)
            reported = done
