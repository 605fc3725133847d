"""The Thrift compact protocol, as much of it as a Parquet footer needs.

A view's footer is ours (its row groups, pages and offsets are new) but its schema, key-value
metadata (``ARROW:schema``, ``pandas``, ``huggingface``) and column orders must be the source's
byte for byte, so readers restore the same types.  So the reader keeps, for every field of a
struct, the span of its value bytes (`Struct.raw`), and the writer can put such a span back as
a field of our struct (`Writer.raw`) without understanding it.  The reader is generic (any
struct, fields by id) and strict: every length is checked against the bytes left and nesting is
bounded, so a damaged footer is a `ThriftError` and never a crash or a huge allocation.
Pure Python, no dependencies: a footer is a few KiB to a few MiB and is parsed once per file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT, UUID = range(14)
"""Compact-protocol type codes (a bool field carries its value in its type: TRUE or FALSE)."""
MAX_DEPTH = 64
"""Deepest nesting of structs and containers accepted (a Parquet footer needs about 8)."""


class ThriftError(ValueError):
    """Bytes that are not a valid compact-protocol struct (where and why)."""


@dataclass
class Struct:
    """One decoded struct: ``fields[id]`` its values (int, bytes, float, bool, `Struct`, list or
    dict), ``types[id]`` their type codes and ``raw[id]`` the ``(start, end)`` of each value's
    bytes in the buffer it was read from (for splicing it unchanged into another struct)."""

    fields: dict[int, Any] = field(default_factory=dict)
    types: dict[int, int] = field(default_factory=dict)
    raw: dict[int, tuple[int, int]] = field(default_factory=dict)

    def get(self, fid: int, default: Any = None) -> Any:
        return self.fields.get(fid, default)

    def __contains__(self, fid: int) -> bool:
        return fid in self.fields


class Reader:
    """Reads compact-protocol values from ``buf[pos:end]``."""

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = bytes(buf)
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    def _byte(self) -> int:
        if self.pos >= self.end:
            raise ThriftError(f"truncated at byte {self.pos}")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self._byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ThriftError(f"varint longer than 10 bytes at byte {self.pos}")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def _take(self, n: int) -> bytes:
        if n < 0 or n > self.end - self.pos:
            raise ThriftError(f"length {n} at byte {self.pos} runs past the end ({self.end})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, ttype: int, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ThriftError(f"nested deeper than {MAX_DEPTH} at byte {self.pos}")
        if ttype in (TRUE, FALSE):  # inside a container: one byte, 1 for true
            return self._byte() == TRUE
        if ttype == BYTE:
            b = self._byte()
            return b - 256 if b > 127 else b
        if ttype in (I16, I32, I64):
            return self.zigzag()
        if ttype == DOUBLE:
            return struct.unpack("<d", self._take(8))[0]
        if ttype == BINARY:
            return self._take(self.varint())
        if ttype == UUID:
            return self._take(16)
        if ttype in (LIST, SET):
            head = self._byte()
            n, etype = head >> 4, head & 0x0F
            if n == 15:
                n = self.varint()
            if n > self.end - self.pos:  # every element takes at least one byte
                raise ThriftError(f"list of {n} elements at byte {self.pos} longer than the bytes left")
            return [self.value(etype, depth + 1) for _ in range(n)]
        if ttype == MAP:
            n = self.varint()
            if n == 0:
                return {}
            kv = self._byte()
            if 2 * n > self.end - self.pos:
                raise ThriftError(f"map of {n} entries at byte {self.pos} longer than the bytes left")
            out: dict = {}
            for _ in range(n):
                key = self._key(self.value(kv >> 4, depth + 1))
                if isinstance(key, (Struct, dict)):
                    raise ThriftError(f"a map keyed by structs or maps at byte {self.pos}")
                out[key] = self.value(kv & 0x0F, depth + 1)
            return out
        if ttype == STRUCT:
            return self.struct(depth + 1)
        raise ThriftError(f"unknown type {ttype} at byte {self.pos}")

    @staticmethod
    def _key(k: Any) -> Any:
        if isinstance(k, list):
            if any(isinstance(x, (Struct, dict, list)) for x in k):
                raise ThriftError("a map keyed by a list of structs, maps or lists")
            return tuple(k)
        return k

    def struct(self, depth: int = 0) -> Struct:
        """A struct from the current position up to and including its STOP byte."""
        out = Struct()
        last = 0
        while True:
            head = self._byte()
            if head == STOP:
                return out
            ttype, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            start = self.pos
            if ttype == TRUE or ttype == FALSE:
                out.fields[fid] = ttype == TRUE
            else:
                out.fields[fid] = self.value(ttype, depth)
            out.types[fid] = ttype
            out.raw[fid] = (start, self.pos)


def read_struct(buf: bytes | memoryview, pos: int = 0, end: int | None = None) -> tuple[Struct, int]:
    """The struct at ``buf[pos:]`` and the position after it; `ThriftError` if it is not one."""
    r = Reader(buf, pos, end)
    s = r.struct()
    return s, r.pos


class Writer:
    """Writes compact-protocol structs: fields in ascending id order within each struct."""

    def __init__(self) -> None:
        self.out = bytearray()
        self._last: list[int] = [0]

    def getvalue(self) -> bytes:
        return bytes(self.out)

    def varint(self, v: int) -> None:
        if v < 0:
            raise ValueError("varint of a negative number")
        while v > 0x7F:
            self.out.append((v & 0x7F) | 0x80)
            v >>= 7
        self.out.append(v)

    def zigzag(self, v: int) -> None:
        self.varint((v << 1) ^ (v >> 63))

    def _head(self, fid: int, ttype: int) -> None:
        delta = fid - self._last[-1]
        if 0 < delta <= 15:
            self.out.append((delta << 4) | ttype)
        else:
            self.out.append(ttype)
            self.zigzag(fid)
        self._last[-1] = fid

    def i32(self, fid: int, v: int) -> None:
        self._head(fid, I32)
        self.zigzag(v)

    def i64(self, fid: int, v: int) -> None:
        self._head(fid, I64)
        self.zigzag(v)

    def i16(self, fid: int, v: int) -> None:
        self._head(fid, I16)
        self.zigzag(v)

    def boolean(self, fid: int, v: bool) -> None:
        self._head(fid, TRUE if v else FALSE)

    def binary(self, fid: int, v: bytes) -> None:
        self._head(fid, BINARY)
        self.varint(len(v))
        self.out += v

    def raw(self, fid: int, ttype: int, value_bytes: bytes) -> None:
        """A field whose value is ``value_bytes``, encoded elsewhere (a span `Struct.raw` gave)."""
        self._head(fid, ttype)
        self.out += value_bytes

    def begin_struct(self, fid: int | None = None) -> None:
        """Start a struct: a field ``fid`` of the current one, or (None) a list element / the top."""
        if fid is not None:
            self._head(fid, STRUCT)
        self._last.append(0)

    def end_struct(self) -> None:
        self.out.append(STOP)
        self._last.pop()

    def begin_list(self, fid: int, etype: int, n: int) -> None:
        self._head(fid, LIST)
        if n < 15:
            self.out.append((n << 4) | etype)
        else:
            self.out.append(0xF0 | etype)
            self.varint(n)

    def elem_i32(self, v: int) -> None:
        self.zigzag(v)

    def elem_binary(self, v: bytes) -> None:
        self.varint(len(v))
        self.out += v


def varint_len(v: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each non-negative ``v`` (int64), vectorised: 1 up to 127, 2 up to
    16383, ...; what the layout adds for every page header field it cannot know in advance."""
    v = np.asarray(v, np.uint64)
    n = np.ones(v.shape, np.int64)
    for k in range(1, 10):
        n += v >= np.uint64(1 << (7 * k))
    return n


def zigzag_len(v: np.ndarray) -> np.ndarray:
    """Bytes of the zigzag varint of each non-negative ``v`` (an i32/i64 field's value)."""
    return varint_len(np.asarray(v, np.int64) * 2)
