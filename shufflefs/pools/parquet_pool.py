"""A pool of Parquet shards (``train-00000-of-00042.parquet``, ...) as one index of rows.

The pool's rows are its members' rows in shard order, planned as one file's (`index.joined_index`:
each member cut into blocks on its own), and laid out as one Parquet source: a footer with the
members' schema and the first member's key-value metadata, their row groups one after the
other, and their per-row sizes joined (`formats.parquet.sizes.RowSizes`).  So a shard of the
pool's stream is laid out and encoded as a single file's view is (`stages.parquet_view`), from a
decoded copy of the whole pool that fills each member's row groups from that member's file
(`member_of`).  Members must share their schema (the same schema elements, byte for byte).
A mixture of Parquet files draws its epochs' rows from such a pool of its files: its views are
laid out over the pool's rows (`PoolRowsPlan`) and read from the pool's copy.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from ..errors import FormatError
from ..formats.parquet.footer import SourceFooter
from ..formats.parquet.index import ParquetIndex
from ..formats.parquet.sizes import ColumnSizes, RowSizes, compact
from ..index.joined_index import PooledIndex, SegmentIndex


def _joined(parts: Sequence[np.ndarray | int | None], rows: Sequence[int]) -> np.ndarray | int | None:
    """Per-row sizes of members (an int: every row alike; None: one level entry per row) as one."""
    if all(p is None for p in parts):
        return None
    if all(isinstance(p, int) for p in parts) and len(set(parts)) == 1:
        return int(parts[0])  # type: ignore[arg-type]
    full = [np.ones(n, np.int64) if p is None else np.full(n, p, np.int64) if isinstance(p, int) else p
            for p, n in zip(parts, rows)]
    return compact(np.concatenate(full))


class PooledParquetIndex(PooledIndex):
    """A `PooledIndex` of Parquet members with the ``footer`` and ``sizes`` of their rows as one
    source (module docstring).  ``member_footers``: each member's own; ``group_member`` and
    ``group_first``: the member of every pooled row group, and each member's first one."""

    footer: SourceFooter
    sizes: RowSizes
    member_footers: tuple[SourceFooter, ...]
    group_member: np.ndarray
    group_first: np.ndarray

    def __init__(self, members: Sequence[ParquetIndex], path: str = "", names: Sequence[str] = ()) -> None:
        """``names``: the members' paths, for an error to name them."""
        super().__init__(list(members))
        first = members[0].footer
        for m, idx in enumerate(members):
            if idx.footer.schema_raw != first.schema_raw:
                other = f" ({names[0]})" if names else ""
                raise FormatError(names[m] if names else path, None, f"pool member {m} has another schema than "
                                  f"member 0{other}: Parquet shards pooled as one must share their schema")
        footers = tuple(idx.footer for idx in members)
        digest = hashlib.sha256("".join(f.digest for f in footers).encode()).hexdigest()
        footer = replace(first, num_rows=sum(f.num_rows for f in footers),
                         group_rows=sum((f.group_rows for f in footers), ()),
                         group_offsets=sum((f.group_offsets for f in footers), ()),
                         group_spans=sum((f.group_spans for f in footers), ()), digest=digest)
        counts = [idx.sizes.n_rows for idx in members]
        starts = np.zeros(len(footer.group_rows) + 1, np.int64)
        np.cumsum(footer.group_rows, out=starts[1:])
        columns = tuple(ColumnSizes(_joined([idx.sizes.columns[c].values for idx in members], counts),  # type: ignore[arg-type]
                                    _joined([idx.sizes.columns[c].entries for idx in members], counts))
                        for c in range(len(first.leaves)))
        sizes = RowSizes(int(starts[-1]), starts, columns, members[0].sizes.booleans, digest)
        groups = np.array([len(f.group_rows) for f in footers], np.int64)
        put = object.__setattr__  # the dataclass is frozen
        put(self, "footer", footer)
        put(self, "sizes", sizes)
        put(self, "tail", b"")
        put(self, "member_footers", footers)
        put(self, "group_member", np.repeat(np.arange(len(members), dtype=np.int64), groups))
        put(self, "group_first", np.concatenate(([0], np.cumsum(groups))).astype(np.int64))

    def member_of(self, group: int) -> tuple[int, int]:
        """``(member, its own row group)`` of pooled row group ``group``."""
        m = int(self.group_member[group])
        return m, group - int(self.group_first[m])


def joined_parquet(members: list[ParquetIndex], names: Sequence[str] = ()) -> PooledParquetIndex:
    """The pool of Parquet ``members`` (a worker thread's work: O(rows)); ``names``: their paths."""
    if not all(isinstance(m, ParquetIndex) for m in members):
        raise FormatError("", None, "a pool of Parquet files whose index is not a Parquet index")
    return PooledParquetIndex(members, names=names)


class PoolRowsPlan:
    """A plan over an epoch of a mixture of Parquet files (a `SegmentIndex` over their pool)
    whose windows give rows of the pool: what a view's layout and its copy (the pool's) are
    indexed by.  A row the epoch takes twice is the same pool row twice.  Everything else is the
    plan's (its windows' sizes and counts, the same over either index)."""

    def __init__(self, plan: Any, index: SegmentIndex) -> None:
        self.inner, self.segments = plan, index

    def window(self, k: int) -> np.ndarray:
        return self.segments.base_ids_of(np.asarray(self.inner.window(k), np.int64))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def check_schemas(footers: Sequence[tuple[str, SourceFooter]], where: str) -> None:
    """Files of one mixture must share one schema (their shards are Parquet files of it):
    `FormatError` naming the first file of another schema than the first file, and the columns
    of both."""
    if not footers:
        return
    first, f0 = footers[0]
    for path, f in footers[1:]:
        if f.schema_raw != f0.schema_raw:
            cols = [", ".join(n.name for n in x.top) for x in (f0, f)]
            raise FormatError(path, None, f"{where}: its schema differs from that of {first} (columns {cols[1]} "
                              f"against {cols[0]}); the Parquet files of a mixture must share one schema")
