"""What a gzip file's scan checks around the decoder: its first bytes, where its stream ends, and
the zero padding some tools write after the last member.  The zstd counterpart walks the frames
(`zstd_walk`)."""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np

from ..errors import FormatError

MAGIC = b"\x1f\x8b"
Read = Callable[[int, int], bytes]

TOLERATED = 4
"""Zero bytes after a stream's last member that rapidgzip (0.16) reads past as the end: with more it
fails ("Invalid gzip/zlib wrapper"), so a padded file is decoded up to that many zeros after its
last nonzero byte (`tests/pure/test_gzip_padding.py` holds the library to it)."""
MEMBER_TAIL = 4096
"""Bytes before the zeros in which the start of a short last member is looked for (`_member_end`)."""


def check_magic(read: Read, size: int, path: str) -> None:
    """`FormatError` unless a non-empty file starts with the gzip magic: rapidgzip decoded plain
    text to no bytes, without an error, and such a file was served as an empty view."""
    magic = bytes(read(0, min(2, size)))
    if size and magic != MAGIC:
        raise FormatError(path, 0, f"not a gzip stream: it starts with {magic!r}, not the gzip magic {MAGIC!r}")


def trailing_zeros(read: Read, size: int) -> int:
    """Zero bytes the file ends in (up to the whole file)."""
    zeros, end = 0, size
    while end > 0:
        tail = np.frombuffer(bytes(read(max(0, end - 65536), end)), np.uint8)
        nz = np.flatnonzero(tail)
        if len(nz):
            return zeros + len(tail) - int(nz[-1]) - 1
        zeros, end = zeros + len(tail), end - len(tail)
    return zeros


def stream_end(read: Read, size: int) -> int:
    """Where the gzip stream of a file of ``size`` bytes ends for the decoder: ``size``, but for
    zero padding after the last member (written by tools that fill a block; `gzip` and Python's
    `gzip` skip it).  A member's trailer (CRC-32, then the length modulo 2**32) ends in at most
    three zero bytes unless its length is a multiple of 4 GiB or the member is empty (then its
    trailer is all zeros): so the stream is taken to end `TOLERATED` bytes after the last nonzero
    byte, which rapidgzip reads past, unless a short last member (an empty one, say) decodes alone
    to its exact end.  Every byte up to that end is decoded and checked; a file cut short or
    damaged still fails as before."""
    zeros = trailing_zeros(read, size)
    if zeros <= TOLERATED:
        return size
    last = size - zeros  # one past the last nonzero byte
    short = _member_end(read, last, size)
    return short if short is not None else last + TOLERATED


def _member_end(read: Read, last: int, size: int) -> int | None:
    """The end of a last member that starts within `MEMBER_TAIL` bytes of the last nonzero byte
    ``last`` and decodes whole there, followed by zeros only (its trailer may lie among them);
    else None."""
    start = max(0, last - MEMBER_TAIL)
    tail = bytes(read(start, min(size, last + 16)))
    at = tail.rfind(MAGIC)
    while at >= 0:
        d = zlib.decompressobj(31)
        try:
            d.decompress(tail[at:], 1 << 24)
            if d.eof and not d.unused_data.strip(b"\0"):
                end = start + len(tail) - len(d.unused_data)
                if end >= last:
                    return end
        except zlib.error:
            pass
        at = tail.rfind(MAGIC, 0, at)
    return None


def padding_note(read: Read, size: int) -> str:
    """What to add to a gzip stream's error when the file ends in zero bytes beyond what was
    decoded (`stream_end`): padding after the last member that rapidgzip could not read past."""
    zeros = trailing_zeros(read, size)
    if zeros <= TOLERATED:
        return ""
    return (f"; the file ends in {zeros} zero bytes, taken as padding after its last member: if the stream is "
            "whole, rewrite it without them (gzip -dc FILE | gzip > NEW)")
