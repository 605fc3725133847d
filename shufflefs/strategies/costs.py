"""Record costs for load-balanced ranks (``--balance``): byte lengths, a JSON lines field (of a
plain or a compressed file), or a Parquet file's numeric column.

Field costs need the records' bytes: the source is mapped read-only and scanned once per file
version (the caller keeps the result), never copied into the daemon's memory.  A compressed
file is decoded as a stream, a step at a time (`decoded_field_costs`): the daemon holds one
decoded step and the start of the record it cuts, never the whole decoded file.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

import numpy as np

from .. import resolve

from ..errors import FormatError
from ..index.table import RecordIndex
from .balance import RecordCostError, compact_costs, field_costs

DECODED_JSON_LINES = {"lines-gzip": "gzip", "lines-zstd": "zstd"}
"""Compressed line formats whose records may be JSON lines, by format name: their codec."""


def record_costs(path: str, index: RecordIndex, field: str | None, format_name: str,
                 load: Callable[[], np.ndarray] | None = None) -> np.ndarray | None:
    """The costs ``make_plan`` takes for ``spec.balance``: None for byte lengths (the plan reads
    them from the index), else the numeric field ``field`` of every JSON lines record.

    Raises `FormatError` naming the file and the record's offset when a record has no such field,
    and for formats other than lines.  ``load``: the file's bytes (default: ``path`` mapped)."""
    if field is None:
        return None
    if format_name == "parquet":
        return parquet_costs(path, index, field, load)
    if format_name in DECODED_JSON_LINES:
        return compressed_costs(path, index, field, DECODED_JSON_LINES[format_name], load)
    if format_name != "lines":
        raise FormatError(path, None, f"--balance-field needs JSON lines, not a {format_name} file")
    if index.n == 0:
        return np.zeros(0, np.int32)
    if load is not None:
        data = load()
    else:
        with os.fdopen(resolve.open_path(path), "rb") as f:
            data = np.memmap(f, np.uint8, "r")  # unmapped when the last view of it goes
    try:
        return compact_costs(field_costs(data, index.bounds, field))
    except RecordCostError as e:
        raise FormatError(path, int(index.bounds[e.record]), f"--balance-field: {e}") from None


def compressed_costs(path: str, index: RecordIndex, field: str, codec: str,
                     load: Callable[[], np.ndarray] | None = None) -> np.ndarray:
    """Costs from the numeric field ``field`` of a compressed JSON lines file's records, its
    index's bounds being decoded offsets: the file (``load``: mapped) decoded as a stream."""
    from ..formats import codecs

    if index.n == 0:
        return np.zeros(0, np.int32)
    data = load() if load is not None else np.memmap(path, np.uint8, "r")
    steps, _ = codecs.decode_all(codec, *codecs.buffer_read(data), path)
    try:
        return compact_costs(decoded_field_costs(steps, index.bounds, field))
    except RecordCostError as e:
        raise FormatError(path, None, f"--balance-field: the record at decoded byte {int(index.bounds[e.record])}: "
                          f"{e}") from None
    except DecodedShort as e:
        raise FormatError(path, None, f"--balance-field: {e}; the index does not fit the file") from None


class DecodedShort(ValueError):
    """The decoded bytes end before the index's last record does."""


def decoded_field_costs(steps: Iterable[memoryview | bytes], bounds: np.ndarray, field: str) -> np.ndarray:
    """`field_costs` over decoded bytes given as consecutive steps (each valid until the next),
    ``bounds`` in decoded offsets: the records whole in what is held are measured, and the part
    of the next one carried over to the next step.  Memory: a step plus the longest record."""
    b = np.asarray(bounds, np.int64)
    n = len(b) - 1
    parts: list[np.ndarray] = []
    carry, at, done = b"", 0, 0  # carry: the decoded bytes from offset ``at``; records < done measured
    for step in steps:
        if done == n:
            break
        buf = carry + bytes(step)
        end = at + len(buf)
        last = int(np.searchsorted(b, end, side="right")) - 1  # records done..last-1 end in buf
        if last > done:
            try:
                parts.append(field_costs(buf, b[done: last + 1] - at, field))
            except RecordCostError as e:
                raise RecordCostError(done + e.record, str(e).split(": ", 1)[1]) from None
            done = last
        keep = min(max(int(b[done]) - at, 0), len(buf))  # from the next record's start (or the header's end)
        carry, at = buf[keep:], at + keep
    if done < n:
        raise DecodedShort(f"the decoded bytes end within record {done} (at decoded byte {at + len(carry)}), "
                           f"the index has {n} records ending at {int(b[-1])}")
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def parquet_costs(path: str, index: RecordIndex, field: str, load: Callable[[], np.ndarray] | None = None) -> np.ndarray:
    """Costs from the numeric column ``field`` of a Parquet file (a top-level column without
    nulls), one per row in file order, read by pyarrow from the file's bytes (``load``: mapped)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = load() if load is not None else np.memmap(path, np.uint8, "r")
    try:
        pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
        if field not in pf.schema_arrow.names:
            raise FormatError(path, None, f"--balance-field: no column {field!r} (columns: {', '.join(pf.schema_arrow.names)})")
        column = pf.read(columns=[field]).column(field)
    except (pa.ArrowException, OSError) as e:
        raise FormatError(path, None, f"--balance-field: column {field!r} cannot be read: {e}") from None
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)) or column.null_count:
        raise FormatError(path, None, f"--balance-field: column {field!r} is {column.type}"
                          f"{' with nulls' if column.null_count else ''}, not numbers for every row")
    costs = column.to_numpy()
    if len(costs) != index.n:
        raise FormatError(path, None, f"--balance-field: {len(costs)} rows, the index {index.n}")
    try:
        return compact_costs(costs.astype(np.int64) if costs.dtype.kind in "iu" else costs.astype(np.float64))
    except ValueError as e:
        raise FormatError(path, None, f"--balance-field: column {field!r}: {e}") from None
