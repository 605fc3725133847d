"""What a gzip file's scan checks around the decoder: its first bytes, and the zero padding some
tools write after the last member.  The zstd counterpart walks the frames (`zstd_walk`)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import FormatError

MAGIC = b"\x1f\x8b"
Read = Callable[[int, int], bytes]


def check_magic(read: Read, size: int, path: str) -> None:
    """`FormatError` unless a non-empty file starts with the gzip magic: rapidgzip decoded plain
    text to no bytes, without an error, and such a file was served as an empty view."""
    magic = bytes(read(0, min(2, size)))
    if size and magic != MAGIC:
        raise FormatError(path, 0, f"not a gzip stream: it starts with {magic!r}, not the gzip magic {MAGIC!r}")


def padding_note(read: Read, size: int) -> str:
    """What to add to a gzip stream's error when the file ends in zero bytes: padding after the
    last member (written by tools that fill a block), which gzip and Python's gzip skip, but whose
    end the decoders here cannot tell from a damaged member's."""
    tail = np.frombuffer(bytes(read(max(0, size - 65536), size)), np.uint8)
    zeros = len(tail) - (int(np.flatnonzero(tail)[-1]) + 1 if tail.any() else 0)
    if zeros < 8:  # a member's trailer ends in up to 8 zero bytes (CRC-32 and length of an empty one)
        return ""
    return (f"; the file ends in {zeros}{'+' if zeros == len(tail) else ''} zero bytes, padding after its last "
            "member that shufflefs does not serve: rewrite it without them (gzip -dc FILE | gzip > NEW)")
