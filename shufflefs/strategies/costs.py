"""Record costs for load-balanced ranks (``--balance``): byte lengths, a JSON lines field, or a
Parquet file's numeric column.

Field costs need the records' bytes: the source is mapped read-only and scanned once per file
version (the caller keeps the result), never copied into the daemon's memory.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .. import resolve

from ..errors import FormatError
from ..index.table import RecordIndex
from .balance import RecordCostError, compact_costs, field_costs


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
