"""NumPy ``.npy`` arrays: each row along axis 0 is a record; the header is kept first.

The view keeps the source header byte for byte, so ``numpy.load`` reads it as the same array
with its rows permuted.  A Fortran-order array (``fortran_order: True``, as pandas'
``to_numpy()`` saved by ``np.save`` often is) keeps its row index: record i is row i, bounds as
if the rows were stored in C order, so it gets the plan a C-order copy of it would get.  Its rows
are not contiguous in the file, so its windows are gathered column by column
(`shufflefs.windows.transposed`) and its view is a C-order array: the header says ``fortran_order:
False`` (rewritten at the same length).  A 0-d array is a single record (the view equals the file).  Arrays whose
rows have no bytes (``shape[0] == 0``, or a zero-sized row such as ``shape (5, 0)``) have no
records: every order of empty rows is the same bytes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import numpy.lib.format as npformat

from ..errors import FormatError
from ..index.table import RecordIndex
from .base import Format, Progress, Read, as_bytes
from .fixed import same_bounds

MAGIC = b"\x93NUMPY"
_LENGTH_BYTES = {(1, 0): 2, (2, 0): 4, (3, 0): 4}


@dataclass(frozen=True)
class NpyHeader:
    version: tuple[int, int]
    header_end: int
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape[1:])

    @property
    def transposed(self) -> bool:
        """Rows are strided in the file (Fortran order with more than one element per row);
        a 1-d or one-column Fortran array has the bytes of its C-order twin."""
        return self.fortran_order and math.prod(self.shape[1:]) > 1


def read_npy_header(data: np.ndarray, path: str) -> NpyHeader:
    """Parse and check the header with numpy's own parser; refuse what rows cannot describe."""
    size = len(data)
    if size < len(MAGIC) + 2 or bytes(data[: len(MAGIC)]) != MAGIC:
        raise FormatError(path, 0, "not a .npy file (bad magic string)")
    version = (int(data[6]), int(data[7]))
    nlen = _LENGTH_BYTES.get(version)
    if nlen is None:
        raise FormatError(path, 6, f"unsupported .npy format version {version[0]}.{version[1]}")
    if size < 8 + nlen:
        raise FormatError(path, 8, "truncated .npy header length")
    header_end = 8 + nlen + int.from_bytes(bytes(data[8 : 8 + nlen]), "little")
    if header_end > size:
        raise FormatError(path, 8, f"header of {header_end} bytes runs past the end of a {size}-byte file")
    fp = io.BytesIO(bytes(data[:header_end]))
    npformat.read_magic(fp)
    limit = header_end + 1
    try:
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(fp, max_header_size=limit)
        else:
            # Version 3 differs from 2 only in using UTF-8 for field names; decoding those bytes as
            # latin-1 changes names, never offsets or sizes, which is all a scan needs.
            shape, fortran, dtype = npformat.read_array_header_2_0(fp, max_header_size=limit)
    except ValueError as e:
        raise FormatError(path, 8 + nlen, f"invalid .npy header: {e}") from None
    if any(d < 0 for d in shape):
        raise FormatError(path, 8 + nlen, f"negative dimension in shape {shape}")
    if dtype.hasobject:
        raise FormatError(path, 8 + nlen, f"object dtype {dtype} holds pickled data, not fixed-size rows")
    return NpyHeader(version, header_end, tuple(shape), bool(fortran), dtype)


class NpyFormat(Format):
    name = "npy"
    extensions = {".npy": {}}

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        data = as_bytes(data)
        size = len(data)
        if size == 0:
            return RecordIndex(0, np.zeros(1, dtype=np.int64))  # empty files give empty views
        index = npy_index(read_npy_header(data, path), size, path)
        if progress is not None:
            progress(size)
        return index

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """The bounds are arithmetic: exactly those the file's header and size give (the header,
        read again, must also end where the records start)."""
        if index.size == 0:
            same_bounds(index, RecordIndex(0, np.zeros(1, np.int64)), path)
            return
        head = read(0, min(index.size, 12))
        nlen = _LENGTH_BYTES.get((head[6], head[7]), 2) if len(head) >= 8 else 2
        end = min(index.size, 8 + nlen + int.from_bytes(head[8: 8 + nlen], "little"))
        h = read_npy_header(np.frombuffer(read(0, end), np.uint8), path)
        same_bounds(index, npy_index(h, index.size, path), path)


def npy_index(h: NpyHeader, size: int, path: str) -> RecordIndex:
    """Rows of ``h`` after its header, filling a file of ``size`` bytes exactly."""
    rows, row_bytes = h.rows, h.row_bytes
    expected = rows * row_bytes
    actual = size - h.header_end
    if actual < expected:
        start = h.header_end + (actual // row_bytes) * row_bytes
        raise FormatError(
            path, start, f"array data is {expected - actual} bytes shorter than shape {h.shape} needs"
        )
    if actual > expected:
        raise FormatError(
            path, h.header_end + expected, f"{actual - expected} bytes follow the array data of shape {h.shape}"
        )
    if expected == 0:
        return RecordIndex(size, np.array([size], dtype=np.int64))
    bounds = np.arange(rows + 1, dtype=np.int64)
    bounds *= row_bytes
    bounds += h.header_end
    return RecordIndex(size, bounds)


def header_with_rows(header: bytes, rows: int, path: str) -> bytes:
    """The ``.npy`` header ``header`` rewritten for an array of ``rows`` rows of the same kind (a
    pooled shard shows a share of the pool's rows), in the first format version that holds it."""
    h = read_npy_header(np.frombuffer(header, np.uint8), path)
    if not h.shape:
        raise FormatError(path, 0, "a 0-d array has no rows to share out")
    # every view is C order: a Fortran array's rows are gathered into it (`shufflefs.windows.transposed`)
    d = {"descr": npformat.dtype_to_descr(h.dtype), "fortran_order": False, "shape": (rows, *h.shape[1:])}
    fp = io.BytesIO()
    try:
        npformat.write_array_header_1_0(fp, d)
    except ValueError:  # too long for a 2-byte length
        fp = io.BytesIO()
        npformat.write_array_header_2_0(fp, d)
    return fp.getvalue()


def row_kind(header: bytes, path: str) -> tuple:
    """What rows of two arrays must share to be pooled: dtype, row shape and layout (rows
    contiguous or strided: a pool's windows are gathered one way, so C and Fortran members of
    more than one column do not pool)."""
    h = read_npy_header(np.frombuffer(header, np.uint8), path)
    layout = "fortran" if h.transposed else "rows"
    return (h.dtype.str if not h.dtype.names else h.dtype.descr, h.shape[1:], layout, len(h.shape))


@dataclass(frozen=True)
class Columns:
    """How a Fortran-order array's rows lie: element (i, c) of a member of ``n`` rows (c the
    Fortran-order index within a row of ``tail`` elements) at data offset ``(c * n + i) *
    itemsize``."""

    itemsize: int
    tail: tuple[int, ...]

    @property
    def count(self) -> int:
        return math.prod(self.tail)


def columns_of(header: bytes, path: str) -> Columns | None:
    """The column layout of an array whose rows are strided (`NpyHeader.transposed`), else None."""
    h = read_npy_header(np.frombuffer(header, np.uint8), path)
    return Columns(h.dtype.itemsize, h.shape[1:]) if h.transposed else None


def c_order_header(header: bytes, path: str) -> bytes:
    """``header`` saying ``fortran_order: False``, at its own length (a whole view keeps the
    file's size): the dictionary rewritten into the header's padding."""
    h = read_npy_header(np.frombuffer(header, np.uint8), path)
    d = {"descr": npformat.dtype_to_descr(h.dtype), "fortran_order": False, "shape": h.shape}
    nlen = _LENGTH_BYTES[h.version]
    text = ("{" + "".join(f"'{k}': {v!r}, " for k, v in sorted(d.items())) + "}").encode(  # as numpy writes it
        "utf8" if h.version == (3, 0) else "latin1")
    room = len(header) - 8 - nlen - 1  # the dictionary, spaces, then a newline
    if len(text) > room:
        raise FormatError(path, 8 + nlen, "the header has no room to say fortran_order: False "
                          "(save the array in C order: numpy.save(f, numpy.ascontiguousarray(a)))")
    return header[: 8 + nlen] + text + b" " * (room - len(text)) + b"\n"


FORMATS = (NpyFormat,)
"""The formats this module adds to the registry (`shufflefs.formats.MODULES`)."""
