"""Fixed-size binary records after an optional fixed-size header (raw ``.bin`` dumps, ``.rec``)."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..index.table import RecordIndex
from .base import Format, Progress, Read, as_bytes, bad_index


def _int_param(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class FixedFormat(Format):
    """``header_bytes`` of header, then records of exactly ``record_size`` bytes, no trailer.

    A partial trailing record is an error, never silently dropped: serving the file without it
    would change the data a reader sees.
    """

    name = "fixed"
    extensions = {".bin": {}}  # with a --record-size only

    def __init__(self, record_size: int, header_bytes: int = 0) -> None:
        self.record_size = _int_param("record_size", record_size, 1)
        self.header_bytes = _int_param("header_bytes", header_bytes, 0)

    def params(self) -> dict:
        return {"record_size": self.record_size, "header_bytes": self.header_bytes}

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """The bounds are arithmetic: exactly those a scan of a file of this size gives."""
        same_bounds(index, fixed_index(index.size, self.header_bytes, self.record_size, path), path)

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        size = len(as_bytes(data))
        index = fixed_index(size, self.header_bytes, self.record_size, path)
        if progress is not None:
            progress(size)
        return index


def fixed_index(size: int, header_bytes: int, record_size: int, path: str) -> RecordIndex:
    """Records of ``record_size`` bytes tiling ``[header_bytes, size)`` exactly.  An empty file
    has no header to keep: its view is empty, as for every format."""
    if size == 0:
        return RecordIndex(0, np.zeros(1, np.int64))
    if size < header_bytes:
        raise FormatError(path, 0, f"file of {size} bytes is shorter than its {header_bytes}-byte header")
    n, rest = divmod(size - header_bytes, record_size)
    if rest:
        start = header_bytes + n * record_size
        raise FormatError(
            path, start, f"incomplete trailing record: {rest} of {record_size} bytes"
        )
    bounds = np.arange(n + 1, dtype=np.int64)
    bounds *= record_size
    bounds += header_bytes
    return RecordIndex(size, bounds)


def same_bounds(index: RecordIndex, expected: RecordIndex, path: str) -> None:
    """`FramingError` at the first bound of ``index`` that differs from ``expected``'s."""
    a, b = index.bounds, expected.bounds
    if len(a) == len(b) and index.add_newline == expected.add_newline:
        diff = np.flatnonzero(a != b)
        if not len(diff):
            return
        raise bad_index(path, int(a[diff[0]]), f"record {max(int(diff[0]) - 1, 0)} does not start where it must")
    raise bad_index(path, None, f"{len(a) - 1} records where the file's header and size give {len(b) - 1}")


FORMATS = (FixedFormat,)
"""The formats this module adds to the registry (`shufflefs.formats.MODULES`)."""
