"""One label per record, read from where the dataset keeps it, for the label-mix metric and plots.

A label can be a JSON Lines field (for tar shards: the member with that suffix, e.g. ``cls``), a
CSV/TSV column (by header name or 0-based index), a byte of a
fixed-size record, or an ``.npy`` column (an index along axis 1, or a field of a structured
dtype).  Values of any type are mapped to the ints 0..L-1 in sorted order, so digits 0-9 keep
their numbers and strings sort alphabetically.  A record without its label raises `FormatError`
naming the file and the record's offset.  This runs once per inspection, not when serving reads,
so parsing a text record per label is acceptable; byte and ``.npy`` labels are pure numpy.
"""

from __future__ import annotations

import csv
import json
import numbers
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import FormatError
from ..index.table import RecordIndex

FIELD, COLUMN, BYTE = "field", "column", "byte"


@dataclass(frozen=True)
class LabelSource:
    """Where the label is: a JSONL ``field``, a CSV/TSV/.npy ``column`` or a ``byte`` offset."""

    kind: str
    key: str | int

    def __post_init__(self) -> None:
        if self.kind not in (FIELD, COLUMN, BYTE):
            raise ValueError(f"unknown label kind {self.kind!r} (field, column or byte)")
        if self.kind == BYTE and (not isinstance(self.key, int) or self.key < 0):
            raise ValueError(f"a label byte offset must be a non-negative integer, got {self.key!r}")

    def describe(self) -> str:
        return {FIELD: "field", COLUMN: "column", BYTE: "byte"}[self.kind] + f" {self.key}"


@dataclass(frozen=True)
class Labels:
    """``codes[i]`` is the label of record i, an index into ``names``."""

    codes: np.ndarray
    names: list[str]

    @property
    def n_labels(self) -> int:
        return len(self.names)


# --------------------------------------------------------------------------- values -> ints


def encode_labels(values: Sequence[Any] | np.ndarray) -> Labels:
    """Map arbitrary label values to 0..L-1, in sorted order of the values.

    Numbers sort numerically; anything else (strings, mixed types, lists) sorts by its text,
    with non-strings written as JSON so ``1`` and ``"1"`` stay different labels.
    """
    arr = values if isinstance(values, np.ndarray) else None
    if arr is None:
        vals = list(values)
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in vals):
            arr = np.asarray(vals, dtype=np.float64 if any(isinstance(v, float) for v in vals) else np.int64)
        elif vals and all(isinstance(v, str) for v in vals) and (numeric := _numeric(vals)) is not None:
            # CSV cells are text: "10" sorts after "9" when every cell is a number
            uniq, first, codes = np.unique(numeric, return_index=True, return_inverse=True)
            return Labels(codes.reshape(-1).astype(np.int64), [vals[i] for i in first.tolist()])
        else:
            arr = np.asarray([v if isinstance(v, str) else json.dumps(v, sort_keys=True) for v in vals], dtype=object)
            arr = arr.astype(str) if len(arr) else np.zeros(0, dtype=str)
    if arr.dtype.fields is not None or arr.ndim != 1:
        raise ValueError("labels must be one scalar per record")
    uniq, codes = np.unique(arr, return_inverse=True)
    return Labels(codes.reshape(-1).astype(np.int64), [_name(u) for u in uniq.tolist()])


def _numeric(vals: list[str]) -> np.ndarray | None:
    """The strings as numbers if every one is an integer (else a float), or None."""
    text = np.asarray(vals)
    for dtype in (np.int64, np.float64):
        try:
            out = text.astype(dtype)
        except (ValueError, OverflowError):
            continue
        if dtype == np.float64 and np.isnan(out).any():
            return None
        return out
    return None


def _name(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, bytes):
        return v.decode("latin-1")
    return str(v)


# --------------------------------------------------------------------------- extractors


def _region(data: np.ndarray, index: RecordIndex) -> bytes:
    return bytes(data[index.header_end: index.trailer_start])


def _records(data: np.ndarray, index: RecordIndex) -> tuple[bytes, np.ndarray]:
    """The record bytes as one string and every record's start within it."""
    return _region(data, index), index.starts - index.header_end


def jsonl_field(index: RecordIndex, data: np.ndarray, field: str, path: str = "") -> list[Any]:
    """The top-level ``field`` of every JSON Lines record."""
    blob, starts = _records(data, index)
    ends = index.bounds[1:] - index.header_end
    out: list[Any] = []
    loads = json.loads
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        try:
            obj = loads(blob[a:b])
        except ValueError as e:
            raise FormatError(path, index.header_end + a, f"record {i} is not valid JSON: {e}") from None
        if not isinstance(obj, dict) or field not in obj:
            raise FormatError(path, index.header_end + a, f"record {i} has no field {field!r}")
        out.append(obj[field])
    return out


def csv_column(index: RecordIndex, data: np.ndarray, column: str | int, path: str = "", delimiter: str = ",") -> list[str]:
    """Column ``column`` (a header name, else a 0-based index) of every CSV/TSV record.

    Each record is parsed on its own by the csv module, so quoted fields holding newlines or
    delimiters are read as the format's scan delimited them.
    """
    header_text = bytes(data[: index.header_end]).decode("utf-8", "replace")
    header = next(csv.reader([header_text], delimiter=delimiter), []) if header_text else []
    if isinstance(column, str) and column in header:
        col = header.index(column)
    else:
        try:
            col = int(column)
        except ValueError:
            known = f" (header: {', '.join(header)})" if header else " (the file has no header)"
            raise ValueError(f"{path}: no column {column!r}{known}") from None
        if col < 0:
            raise ValueError(f"{path}: column index must be >= 0, got {col}")
    blob, starts = _records(data, index)
    ends = index.bounds[1:] - index.header_end
    texts = [blob[a:b].decode("utf-8", "replace") for a, b in zip(starts.tolist(), ends.tolist())]
    out: list[str] = []
    for i, row in enumerate(csv.reader(texts, delimiter=delimiter)):
        if col >= len(row):
            off = index.header_end + int(starts[min(i, len(starts) - 1)])
            raise FormatError(path, off, f"record {i} has {len(row)} fields, no column {column!r}")
        out.append(row[col])
    if len(out) != index.n:
        raise FormatError(path, index.header_end, f"csv module read {len(out)} rows from {index.n} records")
    return out


def record_byte(index: RecordIndex, data: np.ndarray, offset: int, path: str = "") -> np.ndarray:
    """Byte ``offset`` of every record (fixed-size records: a class id stored in one byte)."""
    if index.n == 0:
        return np.zeros(0, np.uint8)
    short = np.flatnonzero(index.lengths <= offset)
    if len(short):
        i = int(short[0])
        raise FormatError(path, int(index.starts[i]), f"record {i} has {int(index.lengths[i])} bytes, no byte {offset}")
    return np.asarray(data)[index.starts + offset]


def npy_column(index: RecordIndex, data: np.ndarray, column: str | int, path: str = "") -> np.ndarray:
    """Column ``column`` of an ``.npy`` array: a structured field by name, else an index along
    axis 1 (a 1-d array's records are their own labels; pass column 0)."""
    from ..formats.npy import read_npy_header

    h = read_npy_header(np.asarray(data), path)
    body = np.ascontiguousarray(np.asarray(data)[h.header_end: h.header_end + h.rows * h.row_bytes])
    arr = np.frombuffer(body, dtype=h.dtype).reshape(h.shape if h.shape else (1,))
    if h.dtype.names:
        if column not in h.dtype.names:
            raise ValueError(f"{path}: no field {column!r} (fields: {', '.join(h.dtype.names)})")
        col = arr[column]
        if col.ndim != 1:
            raise ValueError(f"{path}: field {column!r} is not one scalar per row")
        return col
    try:
        j = int(column)
    except ValueError:
        raise ValueError(f"{path}: a {h.dtype} array has no named fields; give a column index") from None
    if arr.ndim == 1:
        if j != 0:
            raise ValueError(f"{path}: a 1-d array has one column (0), not {j}")
        return arr
    if arr.ndim != 2 or not 0 <= j < arr.shape[1]:
        raise ValueError(f"{path}: column {j} outside an array of shape {h.shape} (rows need 2 dimensions)")
    return arr[:, j]


def tar_member(index: RecordIndex, data: np.ndarray, suffix: str, path: str = "") -> list[Any]:
    """The content of each sample's ``<key>.<suffix>`` member (a WebDataset ``.cls``, ``.txt``...),
    as an int where it reads as one: one pass of `tarfile` over the archive."""
    import io
    import tarfile

    values: list[Any] = [None] * index.n
    end = "." + suffix.lstrip(".")
    with tarfile.open(fileobj=io.BytesIO(memoryview(data)), mode="r:") as t:
        for m in t:
            if not m.isreg() or not m.name.endswith(end) or "." in m.name.rsplit("/", 1)[-1][: -len(end)]:
                continue
            i = int(np.searchsorted(index.bounds, m.offset, side="right")) - 1
            if 0 <= i < index.n:
                text = t.extractfile(m).read().decode("utf-8", "replace").strip()
                values[i] = int(text) if text.lstrip("-").isdigit() else text
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        raise FormatError(path, int(index.bounds[missing[0]]), f"sample has no .{suffix.lstrip('.')} member")
    return values


def extract_labels(index: RecordIndex, fmt_name: str, data: np.ndarray, source: LabelSource, path: str = "") -> Labels:
    """The label of every record of a file of format ``fmt_name`` (a `shufflefs.formats` name)."""
    data = np.asarray(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if source.kind == BYTE:
        values: Any = record_byte(index, data, int(source.key), path)
    elif source.kind == FIELD and fmt_name == "tar":
        values = tar_member(index, data, str(source.key), path)
    elif source.kind == FIELD:
        if fmt_name != "lines":
            raise ValueError(f"{path}: --label-field reads JSON Lines; this file's format is {fmt_name!r}")
        values = jsonl_field(index, data, str(source.key), path)
    elif fmt_name == "npy":
        values = npy_column(index, data, source.key, path)
    elif fmt_name in ("csv", "lines"):
        delimiter = "\t" if str(path).lower().endswith(".tsv") else ","
        values = csv_column(index, data, source.key, path, delimiter)
    else:
        raise ValueError(f"{path}: --label-column reads CSV, TSV or .npy files; this file's format is {fmt_name!r}")
    if len(values) != index.n:
        raise ValueError(f"{path}: {len(values)} labels for {index.n} records")
    return encode_labels(values)


def read_source(path: str | os.PathLike, fmt: Any = None) -> np.ndarray:
    """The whole file as a uint8 array; a compressed file's (``fmt.codec``) decoded bytes."""
    if fmt is not None and getattr(fmt, "codec", None) is not None:
        from ..formats.compressed import decoded_bytes

        return decoded_bytes(path, fmt)
    return np.fromfile(os.fspath(path), dtype=np.uint8)


def parquet_columns(path: str | os.PathLike) -> list[str]:
    """The top-level column names of a Parquet file (what ``--label-field`` can name)."""
    import pyarrow.parquet as pq

    return list(pq.read_schema(os.fspath(path)).names)


def parquet_labels(paths: Sequence[str | os.PathLike], column: str, n_rows: int) -> Labels:
    """Column ``column`` of the rows of Parquet files ``paths`` (a pool's members in pool order),
    read alone from each file (only its column chunks), as labels; ValueError naming the file and
    its columns if one lacks it, or if the files hold other than ``n_rows`` rows (changed since
    they were indexed)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    chunks = []
    for path in paths:
        names = parquet_columns(path)
        if column not in names:
            raise ValueError(f"{os.fspath(path)}: no column {column!r} (columns: {', '.join(names)})")
        col = pq.read_table(os.fspath(path), columns=[column]).column(0)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)
                or pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise ValueError(f"{os.fspath(path)}: column {column!r} is of type {col.type}, not one number or "
                             "string per row")
        if col.null_count:
            first = int(pc.index(pc.is_null(col), True).as_py())
            raise FormatError(os.fspath(path), None, f"row {first} has no {column!r} (null)")
        chunks.append(col.combine_chunks() if col.num_chunks else pa.array([], col.type))
    total = sum(len(c) for c in chunks)
    if total != n_rows:
        raise FormatError(os.fspath(paths[0]) if paths else "", None,
                          f"{total} rows where the index has {n_rows}: the file changed; run again")
    if not chunks:
        return encode_labels(np.zeros(0, np.int64))
    values = pa.chunked_array(chunks).combine_chunks() if len(chunks) > 1 else chunks[0]
    if pa.types.is_boolean(values.type):
        values = values.cast(pa.int8())
    arr = values.to_numpy(zero_copy_only=False)
    return encode_labels(arr.astype(str) if arr.dtype == object else arr)
