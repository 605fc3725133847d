"""A compressed view's bytes: the plain view (its records in the epoch's order) wrapped in the
container its name promises, so that readers which decompress (``gzip.open``, ``zstandard``,
pandas and polars by the file's suffix) read it unchanged.

The container compresses nothing.  A gzip view is a series of gzip members, each holding one
*stored* deflate block of up to `GZIP_UNIT` plain bytes (23 bytes of framing per member, 0.035%);
a zstd view is one zstd frame of *raw* blocks of up to `ZSTD_UNIT` bytes (14 bytes of frame
header, 3 per block).  Both are valid files of their format (RFC 1952 members may follow each
other; RFC 8878 raw blocks), and the view's size follows from the plain view's size alone, so it
is known when the view is planned and every byte of it can be computed from the plain bytes
around it: `Container.plain_range` says which plain bytes a read of the view needs,
`Container.render` builds the read from them.  A gzip member's trailer holds the CRC-32 of its
plain bytes, computed as it is served (zlib's, a few GB/s); zstd raw blocks carry no checksum.
Pure byte arithmetic: no I/O, no FUSE.
"""

from __future__ import annotations

import struct
import zlib
from typing import ClassVar

GZIP_UNIT = 65535
"""Plain bytes per gzip member: the most one stored deflate block holds."""
GZIP_HEAD = bytes((0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 255))
"""A member's gzip header: deflate, no flags, no mtime, no extra flags, OS unknown."""
MEMO_UNITS = 64
"""Units whose partial checksums a memo keeps (about one per reader reading sequentially)."""
ZSTD_UNIT = 128 << 10
"""Plain bytes per zstd raw block: the largest block any frame may hold."""
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_WINDOW = 0x38
"""Window descriptor of 128 KiB (exponent 7, mantissa 0): no more than a block, so every
decoder's default window limit accepts the frame (a single-segment frame's window is its whole
content, which decoders refuse beyond 128 MiB)."""


class Container:
    """A view cut into units of `unit` plain bytes, each wrapped in a header of `head` and a
    trailer of `tail` framing bytes, after a file header of `prefix` bytes.  An empty plain view
    is an empty view, as an empty file's is (readers take an empty file as empty content)."""

    name: ClassVar[str]
    unit: ClassVar[int]
    prefix: ClassVar[int]
    head: ClassVar[int]
    tail: ClassVar[int]

    def units(self, plain: int) -> int:
        return -(-plain // self.unit)

    def size(self, plain: int) -> int:
        """Bytes of the view of a plain view of ``plain`` bytes."""
        return 0 if plain <= 0 else self.prefix + plain + self.units(plain) * (self.head + self.tail)

    def _span(self, off: int, size: int, plain: int) -> tuple[int, int, int]:
        """The served bytes ``[off, end)`` of the read, clipped, and the first unit they touch."""
        end = min(off + size, self.size(plain))
        step = self.unit + self.head + self.tail
        return off, end, max(0, off - self.prefix) // step

    def plain_range(self, off: int, size: int, plain: int, memo: dict | None = None) -> tuple[int, int]:
        """The plain bytes ``[lo, hi)`` a read of ``[off, off+size)`` needs: those it shows, and
        the whole of every unit whose trailer it shows (a gzip member's CRC), but for the part of
        it ``memo`` holds the checksum of (`render` keeps there the checksums of the units a read
        leaves unfinished, so that a sequential reader never reads back)."""
        off, end, u = self._span(off, size, plain)
        step, n = self.unit + self.head + self.tail, self.units(plain)
        lo = hi = None
        while u < n:
            start = self.prefix + u * step
            if start >= end:
                break
            p0, length = u * self.unit, min(self.unit, plain - u * self.unit)
            d0 = start + self.head
            t0 = d0 + length
            shown = p0 + min(max(off, d0), t0) - d0
            if self.tail and off < t0 + self.tail and end > t0:  # its trailer: the whole unit
                a, b = self._checked_from(memo, u, p0, shown), p0 + length
            else:
                a, b = shown, p0 + min(end, t0) - d0
            if b > a:
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
            u += 1
        return (0, 0) if lo is None else (lo, hi)

    @staticmethod
    def _checked_from(memo: dict | None, u: int, p0: int, shown: int, lo: int = 0) -> int:
        """Where unit ``u``'s checksum must be taken up from: its start, or the furthest point
        ``memo`` holds its checksum at, no later than the first byte the read shows of it and no
        earlier than the plain bytes at hand (from ``lo``)."""
        got = memo.get(u) if memo is not None else None
        return max((c for c in got if lo <= c <= shown), default=p0) if got else p0

    def render(self, off: int, size: int, plain: int, lo: int, data: bytes | memoryview,
               memo: dict | None = None) -> bytearray:
        """The view's bytes ``[off, off+size)`` (shorter at its end), from plain bytes ``data``
        starting at plain offset ``lo`` (at least `plain_range` with the same ``memo``)."""
        off, end, u = self._span(off, size, plain)
        out = bytearray(max(0, end - off))
        if not out:
            return out
        data = memoryview(data)
        if off < self.prefix:
            head = self.file_head(plain)
            out[0: min(end, self.prefix) - off] = head[off: min(end, self.prefix)]
        step, n = self.unit + self.head + self.tail, self.units(plain)
        while u < n:
            start = self.prefix + u * step
            if start >= end:
                break
            p0, length = u * self.unit, min(self.unit, plain - u * self.unit)
            d0 = start + self.head
            t0 = d0 + length
            if off < d0 and end > start:
                h = self.unit_head(u, length, u == n - 1)
                a, b = max(off, start), min(end, d0)
                out[a - off: b - off] = h[a - start: b - start]
            if off < t0 and end > d0:
                a, b = max(off, d0), min(end, t0)
                out[a - off: b - off] = data[p0 + a - d0 - lo: p0 + b - d0 - lo]
                if self.tail and memo is not None and end < t0:  # left unfinished: keep its checksum
                    self._remember(memo, u, p0, lo, p0 + b - d0, data)
            if self.tail and off < t0 + self.tail and end > t0:
                shown = p0 + min(max(off, d0), t0) - d0
                since = self._checked_from(memo, u, p0, shown, lo)
                if since < lo:  # the checksum it was planned from is gone (many readers): plan again
                    raise LookupError(f"unit {u}: no checksum of its bytes before {lo}")
                value = memo[u][since] if since > p0 else 0
                t = self.unit_tail(self.running(data[since - lo: p0 + length - lo], value), length)
                a, b = max(off, t0), min(end, t0 + self.tail)
                out[a - off: b - off] = t[a - t0: b - t0]
            u += 1
        return out

    def _remember(self, memo: dict, u: int, p0: int, lo: int, upto: int, data: memoryview) -> None:
        """Keep unit ``u``'s checksum of plain bytes ``[p0, upto)`` (a pure function of them, so
        readers share it), from the data at hand, or from a checksum ``memo`` holds within it."""
        got = memo.setdefault(u, {})
        since = p0 if lo <= p0 else max((c for c in got if lo <= c <= upto), default=None)
        if since is not None and upto not in got:
            got[upto] = self.running(data[since - lo: upto - lo], got[since] if since > p0 else 0)
        if not got:
            del memo[u]
        while len(memo) > MEMO_UNITS:
            memo.pop(next(iter(memo)))

    def file_head(self, plain: int) -> bytes:
        return b""

    def unit_head(self, u: int, length: int, last: bool) -> bytes:
        raise NotImplementedError

    def unit_tail(self, value: int, length: int) -> bytes:
        return b""

    def running(self, data: memoryview, value: int) -> int:
        """A unit's checksum so far, ``value``, taken on over ``data``."""
        return 0


class GzipMembers(Container):
    """gzip members of one stored deflate block each (RFC 1951 3.2.4: BFINAL=1, BTYPE=00, then
    LEN and its complement), each closed by the CRC-32 and length of its bytes."""

    name = "gzip"
    unit, prefix, head, tail = GZIP_UNIT, 0, len(GZIP_HEAD) + 5, 8

    def unit_head(self, u: int, length: int, last: bool) -> bytes:
        return GZIP_HEAD + struct.pack("<BHH", 1, length, length ^ 0xFFFF)

    def unit_tail(self, value: int, length: int) -> bytes:
        return struct.pack("<II", value & 0xFFFFFFFF, length & 0xFFFFFFFF)

    def running(self, data: memoryview, value: int) -> int:
        return zlib.crc32(data, value)


class ZstdRawFrame(Container):
    """One zstd frame (RFC 8878 3.1.1): a header with the content size (8 bytes) and a 128 KiB
    window, then raw blocks, the last one flagged; no checksum."""

    name = "zstd"
    unit, prefix, head, tail = ZSTD_UNIT, 14, 3, 0

    def file_head(self, plain: int) -> bytes:
        return ZSTD_MAGIC + bytes((0xC0, ZSTD_WINDOW)) + struct.pack("<Q", plain)

    def unit_head(self, u: int, length: int, last: bool) -> bytes:
        return ((length << 3) | int(last)).to_bytes(3, "little")  # block type 0: raw


CONTAINERS = {c.name: c for c in (GzipMembers(), ZstdRawFrame())}
"""The containers by the codec of the files whose views they frame."""


def container_of(fmt: object) -> Container | None:
    """The container a format's views are served in (`Format.codec`); None: their plain bytes."""
    return CONTAINERS.get(getattr(fmt, "codec", None) or "")


def served_size(fmt: object, plain: int) -> int:
    """Bytes of a view of format ``fmt`` whose plain view has ``plain`` bytes."""
    container = container_of(fmt)
    return plain if container is None else container.size(plain)
