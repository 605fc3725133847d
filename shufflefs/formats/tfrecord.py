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
from ..index.table import RecordIndex
from .base import (PROGRESS_EVERY, Format, Progress, Read, WindowCheck, as_bytes, bad_index,
                   framing_error, window_ends)

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
    framing = "tfrecord"
    extensions = {".tfrecord": {}, ".tfrecords": {}}

    def __init__(self, verify_data: bool = True) -> None:
        if not isinstance(verify_data, (bool, np.bool_)):
            raise ValueError(f"verify_data must be a boolean, got {verify_data!r}")
        self.verify_data = bool(verify_data)

    def params(self) -> dict:
        return {"verify_data": self.verify_data}

    def window_check(self) -> WindowCheck | None:
        return check_frames if self.verify_data else None

    def frame_check(self) -> WindowCheck | None:
        return check_lengths

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """Frames tile the whole file and each holds at least its 16 bytes of framing."""
        if index.header_end != 0 or index.trailer_start != index.size:
            raise bad_index(path, index.header_end, "frames do not tile the file")
        short = np.flatnonzero(index.lengths < FRAME_OVERHEAD)
        if len(short):
            raise bad_index(path, int(index.bounds[short[0]]), "a frame shorter than its framing")

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


def _masked(crcs: np.ndarray) -> np.ndarray:
    c = crcs.astype(np.uint64)
    return ((((c >> np.uint64(15)) | (c << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _fields(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lengths, starts, ends, stored length fields)`` of a window's frames, vectorised."""
    lengths = index.record_lengths(ids)
    ends = window_ends(window, ids, index, path)
    starts = ends - lengths
    at = np.minimum(starts[:, None] + np.arange(8), len(window) - 1)  # a frame of < 8 bytes: still in bounds
    return lengths, starts, ends, window[at].view("<u8").ravel()


def check_lengths(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """Every frame of a gathered window starts with the length the index gives it (the framing
    check, whatever ``--verify`` says: 8 bytes read per frame)."""
    ids = np.asarray(ids, np.int64)
    if not len(ids):
        return
    lengths, _, _, stored = _fields(window, ids, index, path)
    bad = stored.astype(np.int64) != lengths - FRAME_OVERHEAD
    if bad.any():
        raise framing_error(path, index, ids, bad, "frame length changed")


def check_frames(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """Every frame of a gathered window checked again: its length against the index, its length
    and data checksums against its bytes.  The scan checked them once; a byte changed in the
    source since (with its mtime set back, so the change went unseen) would otherwise be served.

    One crc32c call per frame (hardware CRC, 16 GB/s here); everything else is vectorised.  The
    per-frame call still costs about 0.3 us: measured with ``tools/verify_cost.py`` (retired, in git at fa6dcf3; 256 MiB of
    1-4 KiB frames, warm corgipile view, 1 MiB reads, 2-core VM) the view reads at 0.54-0.60x of
    ``--verify index`` (1.7-1.9 against 3.1-3.2 GB/s), hence the option."""
    ids = np.asarray(ids, np.int64)
    n = len(ids)
    if n == 0:
        return
    check_lengths(window, ids, index, path)
    lengths, starts, ends, stored_len = _fields(window, ids, index, path)
    buf = memoryview(np.ascontiguousarray(window[: int(ends[-1])]))
    raw = np.frombuffer(buf, np.uint8)
    gather = lambda at, width: raw[(at[:, None] + np.arange(width)).ravel()].reshape(-1, width)  # noqa: E731
    stored_len_crc = gather(starts + 8, 4).copy().view("<u4").ravel()
    stored_data_crc = gather(ends - 4, 4).copy().view("<u4").ravel()
    crc = crc32c.crc32c
    # the length field is known from the index: one checksum per distinct length
    distinct, which = np.unique(stored_len, return_inverse=True)
    len_crcs = np.fromiter((crc(struct.pack("<Q", v)) for v in distinct.tolist()), np.uint32,
                           count=len(distinct))[which]
    data_crcs = np.fromiter((crc(buf[s: e]) for s, e in zip((starts + 12).tolist(), (ends - 4).tolist())),
                            np.uint32, count=n)
    bad = (_masked(len_crcs) != stored_len_crc) | (_masked(data_crcs) != stored_data_crc)
    if bad.any():
        raise framing_error(path, index, ids, bad, "frame checksum mismatch")


FORMATS = (TFRecordFormat,)
"""The formats this module adds to the registry (`shufflefs.formats.MODULES`)."""
