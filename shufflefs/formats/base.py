"""What every record format provides: a vectorised scan of a file's bytes to a `RecordIndex`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar

import numpy as np

from ..errors import FormatError
from ..index.table import RecordIndex

Progress = Callable[[int], None]
"""Called with the number of bytes scanned so far (for progress bars)."""
WindowCheck = Callable[[np.ndarray, np.ndarray, RecordIndex, str], None]
"""``check(window bytes, record ids in window order, index, path)``: raises `FormatError` if a
record in a window just gathered is damaged (a source byte changed after the index was built)
or not where the index says (a wrong index)."""
Read = Callable[[int, int], bytes]
"""``read(start, end)``: source bytes ``[start, end)`` (headers read to check an index)."""
FRAMING_ENV = "SHUFFLEFS_FRAMING"
"""Set to ``off`` in a daemon's environment: no framing checks (only to measure what they cost,
``tools/verify_cost.py``, retired, in git at fa6dcf3; never needed otherwise)."""


class FramingError(FormatError):
    """A window's records are not where its index says they are: the index is wrong (a damaged or
    forged cache entry or published index) or the file changed unseen.  The view fails (EIO) and
    the index is dropped, from memory, from the cache and from what this mount takes from a
    published index, so the next open builds it from the file."""


class Format(ABC):
    """A record format.  Instances carry their parameters (e.g. record size)."""

    name: ClassVar[str]
    framing: ClassVar[str | None] = None
    """The compiled check of this format's records (a name in ``_gather.FRAMING_KINDS``: every
    record checked whole, every byte, as it is gathered); None: no window check (offsets are
    computed from the header and checked on load)."""
    extensions: ClassVar[dict[str, dict]] = {}
    """File suffixes (lower case, with the dot) this format claims, each with the parameters it
    implies; a suffix whose format lacks a required parameter (``.bin`` without a
    ``record_size``) passes through unchanged."""
    codec: ClassVar[str | None] = None
    """The compression of the file (``gzip``, ``zstd``): its records are in its decoded bytes
    (`index.decoded`) and its views are served in a container of that codec
    (`windows.container`); None for a file read as it is."""
    planned_size: ClassVar[bool] = False
    """The view's size follows from the index, not from the file's size: views are sized when
    they are planned, as a rank's share is."""

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
        """The full check of every window as it is gathered (``--verify frames``): framing and
        per-record checksums (TFRecord CRCs); None: the framing check alone."""
        return None

    def frame_check(self) -> WindowCheck | None:
        """Where the compiled module is missing, the numpy check of the records' ends, to which
        `framing.fallback` adds what makes each record whole (the compiled check otherwise)."""
        return None

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """Raise `FramingError` if ``index`` cannot be this file's (checked on every index a
        mount uses, cached or not; cheap: O(records) arithmetic and a header read at most)."""

    def view_size(self, size: int, last_byte: int | None) -> int:
        """Size of the view for a source of ``size`` bytes ending in ``last_byte`` (None if empty).

        Cheap, so that getattr never needs the index.  Only line formats differ from ``size``.
        """
        return size

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}({args})"


def window_ends(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> np.ndarray:
    """Where each record of a gathered window ends in it (int64; with the newline a record of
    ``index.newline_ids`` gains); `FramingError` if the window is shorter than its records."""
    ends = np.cumsum(index.out_lengths(np.asarray(ids, np.int64)))
    if len(ends) and int(ends[-1]) > len(window):
        raise FramingError(path, int(index.bounds[ids[0]]), "window shorter than its records")
    return ends


def framing_error(path: str, index: RecordIndex, ids: np.ndarray, bad: np.ndarray, what: str) -> FramingError:
    """The error for the first record of ``ids`` flagged in ``bad`` (a bool mask)."""
    rid = int(ids[int(np.argmax(bad))])
    return FramingError(path, int(index.bounds[rid]), f"{what} in record {rid}: the index does not fit the file "
                        "(a wrong cache entry, or the file changed after it was indexed); it is rebuilt")


def bad_index(path: str, offset: int | None, what: str) -> FramingError:
    return FramingError(path, offset, f"{what}: the index does not fit the file (a wrong cache entry?)")


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
