"""The frames of a zstd file, found by walking their headers (RFC 8878), without decoding: a
zstd file's restart points (`codecs`)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import FormatError

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE = 0x184D2A50  # to 0x184D2A5F
Read = Callable[[int, int], bytes]


def zstd_frames(read: Read, size: int, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every frame of a zstd file: ``(start, end, content size or -1)`` of its data frames
    (skippable frames, such as the seekable format's seek table, are passed over), by walking
    frame and block headers: O(blocks), no decoding."""
    pos = 0
    starts, ends, sizes = [], [], []

    def bad(at: int, what: str) -> FormatError:
        return FormatError(path, at, f"not a zstd stream: {what}")

    while pos < size:
        if size - pos < 8:
            raise bad(pos, "a frame is cut short")
        data = bytes(read(pos, min(size, pos + 18)))  # the longest frame header
        magic = int.from_bytes(data[0:4], "little")
        if magic & 0xFFFFFFF0 == SKIPPABLE:
            pos += 8 + int.from_bytes(data[4:8], "little")
            if pos > size:
                raise bad(size, "a skippable frame is cut short")
            continue
        if magic != ZSTD_MAGIC:
            raise bad(pos, f"unknown magic number 0x{magic:08x}")
        start, fhd = pos, data[4]
        fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        if fhd & 0x08:
            raise bad(pos + 4, "reserved bit set in the frame header")
        at = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
        content = int.from_bytes(data[at: at + fcs_len], "little") + (256 if fcs_len == 2 else 0) if fcs_len else -1
        pos += at + fcs_len
        while True:
            if pos + 3 > size:
                raise bad(pos, "a block header is cut short")
            head = int.from_bytes(read(pos, pos + 3), "little")
            kind, length = (head >> 1) & 3, head >> 3
            if kind == 3:
                raise bad(pos, "reserved block type")
            pos += 3 + (1 if kind == 1 else length)
            if head & 1:
                break
        pos += 4 * checksum
        if pos > size:
            raise bad(size, "the last frame is cut short")
        starts.append(start)
        ends.append(pos)
        sizes.append(content)
    return np.array(starts, np.int64), np.array(ends, np.int64), np.array(sizes, np.int64)
