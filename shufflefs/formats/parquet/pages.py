"""A view's data pages: their sizes (numpy, for the layout) and their bytes (for the encoder),
side by side so that the two cannot drift apart.

Every page is a data page V1, PLAIN, UNCOMPRESSED, without statistics or CRC:
``PageHeader | [repetition levels] | [definition levels] | values``.  Levels are in the
RLE/bit-packed hybrid with a single bit-packed run (``4-byte length | varint((groups << 1) | 1) |
groups * bit_width bytes``, a group being 8 levels, the last one padded): unlike RLE runs, its
size depends only on how many levels there are, never on their values or order.  The header's
size depends on three varints (page size twice, value count), computed by `header_size`.
"""

from __future__ import annotations

import numpy as np

from .thrift import Writer, varint_len, zigzag_len

DATA_PAGE = 0
ENC_PLAIN, ENC_RLE = 0, 3
MAX_I32 = (1 << 31) - 1


def bit_width(max_level: int) -> int:
    """Bits of one level whose largest value is ``max_level`` (0: no levels written)."""
    return int(max_level).bit_length()


def levels_size(entries: np.ndarray | int, width: int) -> np.ndarray | int:
    """Bytes of a level section of ``entries`` levels of ``width`` bits (0 when width is 0)."""
    if width == 0:
        return np.zeros_like(entries) if isinstance(entries, np.ndarray) else 0
    groups = (np.asarray(entries, np.int64) + 7) // 8
    size = 4 + varint_len(groups * 2 + 1) + groups * width
    return size if isinstance(entries, np.ndarray) else int(size)


HEADER_FIXED = 14
"""Bytes of a page header besides its three varints: field headers, the type, the encodings, the
stop bytes of the header and of its DataPageHeader."""


def header_size(body: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """Bytes of the header of pages of ``body`` bytes (after the header) holding ``entries``
    level entries (values, nulls included)."""
    return HEADER_FIXED + 2 * zigzag_len(body) + zigzag_len(entries)


def header(body: int, entries: int) -> bytes:
    """The PageHeader of one page (thrift compact; ``len`` is `header_size`)."""
    w = Writer()
    w.begin_struct()
    w.i32(1, DATA_PAGE)
    w.i32(2, body)  # uncompressed_page_size
    w.i32(3, body)  # compressed_page_size
    w.begin_struct(5)  # data_page_header
    w.i32(1, entries)
    w.i32(2, ENC_PLAIN)
    w.i32(3, ENC_RLE)
    w.i32(4, ENC_RLE)
    w.end_struct()
    w.end_struct()
    return w.getvalue()


def encode_levels(levels: np.ndarray, width: int) -> bytes:
    """A level section: the levels (uint8) as one bit-packed run of the hybrid encoding, with its
    4-byte length; values are packed from the least significant bit, as the format says."""
    n = len(levels)
    groups = (n + 7) // 8
    if width == 1 and levels.all():  # no nulls (the common case): every bit set, then the padding's zeros
        packed = b"\xff" * (n // 8) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
    else:
        padded = np.zeros(groups * 8, np.uint8)
        padded[:n] = levels
        if width in (2, 4):  # 8 // width levels a byte, the first in the lowest bits
            per = padded.reshape(-1, 8 // width)
            packed_a = per[:, 0].copy()
            for j in range(1, 8 // width):
                packed_a |= per[:, j] << np.uint8(j * width)
            packed = packed_a.tobytes()
        else:
            if width > 1:
                padded = ((padded[:, None] >> np.arange(width, dtype=np.uint8)) & 1).reshape(-1)
            packed = np.packbits(padded, bitorder="little").tobytes()
    w = Writer()
    w.varint(groups * 2 + 1)
    run = w.getvalue() + packed
    return len(run).to_bytes(4, "little") + run
