"""The PLAIN bytes of a leaf's values: Arrow values converted to the column's physical type.

pyarrow hands back values as the source's Arrow schema (``ARROW:schema``) says, which is not
always how they are stored: seconds are stored as milliseconds, ``date64`` as days, ``uint32``
as INT32 or INT64, decimals as big-endian bytes of the column's length, timestamps of old
writers as INT96.  So the conversion is driven by the Parquet column (physical type, type length,
logical type and its unit), and the Arrow type only says how to read the buffer.  A view's
column then holds the very values the source's did, and a reader applying the same Arrow schema
gets the same arrays back.  Values are read straight from the Arrow buffers (zero copy) and
gathered with numpy; nothing here loops over values in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import FormatError
from .footer import (BOOLEAN, BYTE_ARRAY, DOUBLE, FIXED_LEN_BYTE_ARRAY, FLOAT, INT32, INT64, INT96,
                     PHYSICAL_NAMES, Leaf)

NS_PER_DAY = 86_400 * 10**9
JULIAN_EPOCH = 2_440_588
"""The Julian day of 1970-01-01 (INT96 timestamps count days from the Julian epoch)."""
ARROW_UNIT_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


@dataclass
class Plain:
    """PLAIN values of one leaf, in value order: ``fixed`` (n, width) uint8 for fixed-width
    types; ``bits`` uint8 0/1 for BOOLEAN; ``data`` with int64 ``starts``/``lens`` for
    BYTE_ARRAY (each value's bytes, its 4-byte length prefix added when it is encoded)."""

    fixed: np.ndarray | None = None
    bits: np.ndarray | None = None
    data: np.ndarray | None = None
    starts: np.ndarray | None = None
    lens: np.ndarray | None = None

    def __len__(self) -> int:
        if self.fixed is not None:
            return len(self.fixed)
        if self.bits is not None:
            return len(self.bits)
        return len(self.lens) if self.lens is not None else 0


def _buffer(buf: Any, dtype: Any, count: int) -> np.ndarray:
    if buf is None or count == 0:
        return np.zeros(count, dtype)
    return np.frombuffer(buf, dtype=dtype, count=count)


def sliced(buf: Any, dtype: Any, offset: int, n: int) -> np.ndarray:
    """Elements ``[offset, offset + n)`` of an Arrow buffer (zero copy; zeros if it is absent)."""
    if buf is None:
        return np.zeros(n, dtype)
    return np.frombuffer(buf, dtype=dtype, count=offset + n)[offset:]


def primitive(arr: Any, dtype: Any) -> np.ndarray:
    """The values buffer of a fixed-width Arrow array, sliced to the array (zero copy)."""
    return _buffer(arr.buffers()[1], dtype, arr.offset + len(arr))[arr.offset :]


def _rows(arr: Any, width: int) -> np.ndarray:
    """(n, width) uint8 view of a fixed-size binary or decimal array's values."""
    flat = _buffer(arr.buffers()[1], np.uint8, (arr.offset + len(arr)) * width)
    return flat.reshape(-1, width)[arr.offset :]


def _as_bytes(v: np.ndarray, width: int) -> np.ndarray:
    return np.ascontiguousarray(v).view(np.uint8).reshape(len(v), width)


def _types() -> Any:
    import pyarrow as pa

    return pa


def int_dtype(pa: Any, t: Any) -> np.dtype:
    kind = "i" if pa.types.is_signed_integer(t) else "u"
    return np.dtype(f"<{kind}{t.bit_width // 8}")


def _decimal_be(le: np.ndarray, length: int) -> np.ndarray:
    """Big-endian two's complement of ``length`` bytes from little-endian rows (n, W)."""
    n, width = le.shape
    if length <= width:
        return np.ascontiguousarray(le[:, :length][:, ::-1])
    out = np.empty((n, length), np.uint8)
    out[:, length - width :] = le[:, ::-1]
    out[:, : length - width] = np.where(le[:, -1:] >= 0x80, 0xFF, 0)
    return out


def _scaled(raw: np.ndarray, arrow_ns: int, stored_ns: int | None) -> np.ndarray:
    """Counts of ``arrow_ns`` nanoseconds as counts of the stored unit (exact: pyarrow made the
    Arrow values from the stored ones)."""
    raw = raw.astype(np.int64)
    if stored_ns is None or stored_ns == arrow_ns:
        return raw
    if arrow_ns > stored_ns:
        return raw * (arrow_ns // stored_ns)
    return np.floor_divide(raw, stored_ns // arrow_ns)


def plain_values(leaf: Leaf, arr: Any, index: np.ndarray, path: str) -> Plain:
    """The PLAIN values ``arr[index]`` of ``leaf`` (``arr``: the walk's leaf array, no nulls
    among ``index``).  `FormatError` if the Arrow type cannot be this column's values."""
    pa = _types()
    t = arr.type
    phys = leaf.physical
    n = len(index)
    where = f"column {leaf.dotted}: {PHYSICAL_NAMES[phys]} read as {t}"
    if pa.types.is_null(t):
        if n:
            raise FormatError(path, None, f"{where} with values")
        return _empty(leaf)
    if phys == BOOLEAN:
        if not pa.types.is_boolean(t):
            raise FormatError(path, None, where)
        bits = np.unpackbits(_buffer(arr.buffers()[1], np.uint8, (arr.offset + len(arr) + 7) // 8),
                             bitorder="little")
        return Plain(bits=bits[arr.offset + index])
    if phys == BYTE_ARRAY:
        return _byte_array(pa, leaf, arr, index, path, where)
    if phys == FIXED_LEN_BYTE_ARRAY:
        return Plain(fixed=_flba(pa, leaf, arr, index, path, where))
    if phys in (FLOAT, DOUBLE):
        want = np.dtype("<f4" if phys == FLOAT else "<f8")
        if not pa.types.is_floating(t) or t.bit_width != want.itemsize * 8:
            raise FormatError(path, None, where)
        return Plain(fixed=_as_bytes(primitive(arr, want)[index], want.itemsize))
    if phys == INT96:
        if not pa.types.is_timestamp(t):
            raise FormatError(path, None, where)
        ns = _scaled(primitive(arr, "<i8")[index], ARROW_UNIT_NS[t.unit], 1)
        days = np.floor_divide(ns, NS_PER_DAY)
        out = np.empty((n, 12), np.uint8)
        out[:, :8] = _as_bytes((ns - days * NS_PER_DAY).astype("<i8"), 8)
        out[:, 8:] = _as_bytes((days + JULIAN_EPOCH).astype("<i4"), 4)
        return Plain(fixed=out)
    if phys not in (INT32, INT64):
        raise FormatError(path, None, where)
    width = 4 if phys == INT32 else 8
    want = np.dtype("<i4" if phys == INT32 else "<i8")
    if pa.types.is_integer(t):
        v = primitive(arr, int_dtype(pa, t))[index]
    elif pa.types.is_date32(t):
        v = primitive(arr, "<i4")[index]
    elif pa.types.is_date64(t):
        v = primitive(arr, "<i8")[index]
        v = np.floor_divide(v, 86_400_000) if phys == INT32 else v
    elif pa.types.is_timestamp(t) or pa.types.is_time(t):
        v = _scaled(primitive(arr, f"<i{t.bit_width // 8}")[index], ARROW_UNIT_NS[t.unit], leaf.time_unit_ns())
    elif pa.types.is_duration(t):
        v = primitive(arr, "<i8")[index]
    elif pa.types.is_decimal(t):
        if t.byte_width < width:
            raise FormatError(path, None, where)
        return Plain(fixed=np.ascontiguousarray(_rows(arr, t.byte_width)[index][:, :width]))
    else:
        raise FormatError(path, None, where)
    return Plain(fixed=_as_bytes(v.astype(want), width))


def _flba(pa: Any, leaf: Leaf, arr: Any, index: np.ndarray, path: str, where: str) -> np.ndarray:
    t = arr.type
    length = leaf.node.type_length
    if pa.types.is_decimal(t):
        return _decimal_be(_rows(arr, t.byte_width)[index], length)
    if pa.types.is_float16(t) and length == 2:
        return _as_bytes(primitive(arr, "<u2")[index], 2)
    if pa.types.is_fixed_size_binary(t) and t.byte_width == length:
        return np.ascontiguousarray(_rows(arr, length)[index])
    raise FormatError(path, None, f"{where} (length {length})")


def _byte_array(pa: Any, leaf: Leaf, arr: Any, index: np.ndarray, path: str, where: str) -> Plain:
    t = arr.type
    if pa.types.is_decimal(t):
        be = _decimal_be(_rows(arr, t.byte_width)[index], t.byte_width)
        n, w = be.shape
        return Plain(data=be.reshape(-1), starts=np.arange(n, dtype=np.int64) * w, lens=np.full(n, w, np.int64))
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())
        t = arr.type
    if pa.types.is_fixed_size_binary(t):
        rows = np.ascontiguousarray(_rows(arr, t.byte_width)[index])
        n, w = rows.shape
        return Plain(data=rows.reshape(-1), starts=np.arange(n, dtype=np.int64) * w, lens=np.full(n, w, np.int64))
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        odt = "<i8"
    elif pa.types.is_string(t) or pa.types.is_binary(t):
        odt = "<i4"
    else:
        raise FormatError(path, None, where)
    bufs = arr.buffers()
    off = _buffer(bufs[1], odt, arr.offset + len(arr) + 1)[arr.offset :]
    starts = off[index].astype(np.int64)
    lens = off[index + 1].astype(np.int64) - starts
    data = _buffer(bufs[2], np.uint8, int(off[-1]) if len(off) else 0)
    return Plain(data=data, starts=starts, lens=lens)


def _empty(leaf: Leaf) -> Plain:
    if leaf.physical == BOOLEAN:
        return Plain(bits=np.zeros(0, np.uint8))
    if leaf.physical == BYTE_ARRAY:
        return Plain(data=np.zeros(0, np.uint8), starts=np.zeros(0, np.int64), lens=np.zeros(0, np.int64))
    return Plain(fixed=np.zeros((0, leaf.width), np.uint8))
