"""TFRecord files: a sequence of framed records, no header or trailer.

Frame: ``uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)``,
all little-endian.  Frames can only be found by walking them one after another, so this scan is
a loop per frame (not per byte); checksums are computed by the ``crc32c`` C extension.
"""

from __future__ import annotations

import struct
from array import array

import crc32c
import numpy as np

from ..errors import FormatError
from ..index import RecordIndex
from .base import PROGRESS_EVERY, Format, Progress, as_bytes

FRAME_OVERHEAD = 16
_MASK_DELTA = 0xA282EAD8


def masked_crc(buf) -> int:
    """TFRecord's masked CRC-32C, so that CRCs of data containing CRCs stay well distributed."""
    c = crc32c.crc32c(buf)
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def encode_frame(payload: bytes) -> bytes:
    """One TFRecord frame (for tests and tools that write small files)."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc(length)) + payload + struct.pack("<I", masked_crc(payload))


class TFRecordFormat(Format):
    """Every length checksum is checked; data checksums too unless ``verify_data=False``.

    Data checks are on by default because the scan reads every byte anyway (the walk touches
    each frame's pages) and a corrupt record would otherwise reach training silently.
    """

    name = "tfrecord"

    def __init__(self, verify_data: bool = True) -> None:
        if not isinstance(verify_data, (bool, np.bool_)):
            raise ValueError(f"verify_data must be a boolean, got {verify_data!r}")
        self.verify_data = bool(verify_data)

    def params(self) -> dict:
        return {"verify_data": self.verify_data}

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        data = as_bytes(data)
        size = len(data)
        buf = memoryview(data)
        head = struct.Struct("<QI").unpack_from
        tail = struct.Struct("<I").unpack_from
        crc = crc32c.crc32c
        verify = self.verify_data
        starts = array("q")
        add = starts.append
        next_report = PROGRESS_EVERY
        pos = 0
        while pos < size:
            if size - pos < 12:
                raise FormatError(path, pos, f"truncated frame: {size - pos} bytes left, need a 12-byte frame header")
            length, length_crc = head(buf, pos)
            c = crc(buf[pos : pos + 8])
            if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                raise FormatError(path, pos, "frame length checksum mismatch")
            end = pos + FRAME_OVERHEAD + length
            if end > size:
                raise FormatError(path, pos, f"truncated frame: record of {length} bytes runs past the end of the file")
            if verify:
                c = crc(buf[pos + 12 : end - 4])
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != tail(buf, end - 4)[0]:
                    raise FormatError(path, pos, "frame data checksum mismatch")
            add(pos)
            pos = end
            if progress is not None and pos >= next_report:
                progress(pos)
                next_report = pos + PROGRESS_EVERY
        add(size)
        del buf
        if progress is not None:
            progress(size)
        return RecordIndex(size, np.frombuffer(starts, dtype=np.int64).copy())
