"""Windows of a Fortran-order ``.npy`` array (or a pool of them): rows gathered from columns.

In such a file element (i, c) of a member of n rows lies at ``data + (c * n + i) * itemsize``
(c the Fortran-order index within a row), so a row's bytes are strided and the record machinery
(runs of contiguous bytes, `layout.assemble`) cannot build its window.  The index still counts
rows with C-order bounds, so every strategy plans these files exactly as their C-order twins;
only the window build differs: the rows' stretches are read from every column at once
(`Source.read_runs`: preads, a pool's members, a remote store alike, verified by the source),
column group by column group within `READ_BUDGET` bytes, and each group is transposed into the
window's C-order rows by numpy.  Stretches of rows closer than `MERGE_GAP` bytes in a column are
read as one, so a record-level window reads whole columns and a block window its blocks' stripes.
"""

from __future__ import annotations

import numpy as np

from ..formats.npy import Columns
from ..index.table import RecordIndex
from ..sources.base import Source
from .layout import id_runs

READ_BUDGET = 8 << 20
"""Bytes of column stripes read at once (a group of columns, or a part of one long column)."""
MERGE_GAP = 64 << 10
"""Row stretches of one column closer than this many bytes are read as one range."""


def _members(index: RecordIndex) -> tuple[np.ndarray, np.ndarray]:
    """First record id of every member then n, and every member's data start (source offsets)."""
    firsts = getattr(index, "member_firsts", None)
    if firsts is None:
        firsts = np.array([0, index.n], np.int64)
    return firsts, index.bounds[firsts[:-1]]


def _ranges(local: np.ndarray, gap_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Stretches ``[start, end)`` of rows covering ``local`` (sorted or not), stretches closer
    than ``gap_rows`` merged."""
    first, count = id_runs(local)
    end = first + count
    keep = np.concatenate(([True], first[1:] - end[:-1] > gap_rows))
    starts = first[keep]
    ends = end[np.concatenate((np.flatnonzero(keep)[1:] - 1, [len(first) - 1]))]
    return starts, ends


def load_columns(source: Source, index: RecordIndex, cols: Columns, ids: np.ndarray,
                 out: np.ndarray) -> np.ndarray:
    """Rows ``ids`` (view order) as C-order rows in ``out`` (``len(ids) * row bytes``)."""
    base = getattr(index, "base", None)
    if base is not None:  # a mixture's epoch: its rows are rows of the pool of its files
        ids, index, source = index.base_ids_of(ids), base, source.reading(base)
    isz, ncol = cols.itemsize, cols.count
    k = len(ids)
    row_bytes = isz * ncol
    out = out[: k * row_bytes]
    if k == 0:
        return out
    unit = np.dtype(f"u{isz}") if isz in (1, 2, 4, 8) else np.dtype(f"V{isz}")
    nd = len(cols.tail) > 1
    # rows with columns in Fortran order: the window itself for a 2-d array
    grid = np.empty((k, ncol), unit) if nd else out.view(unit).reshape(k, ncol)
    firsts, data = _members(index)
    member = np.searchsorted(firsts, ids, side="right") - 1
    single = len(firsts) == 2
    for m in (np.unique(member).tolist() if not single else [0]):
        sel = None if single else np.flatnonzero(member == m)
        local = ids - firsts[m] if sel is None else ids[sel] - firsts[m]
        _member(source, int(data[m]), int(firsts[m + 1] - firsts[m]), isz, ncol, unit, local, grid, sel)
    if nd:  # Fortran-order columns of a row are its elements in reversed-axis C order
        rows = out.view(unit).reshape(k, *cols.tail)
        rev = tuple(range(len(cols.tail), 0, -1))
        np.copyto(rows, grid.reshape(k, *cols.tail[::-1]).transpose(0, *rev))
    return out


def _member(source: Source, data: int, n: int, isz: int, ncol: int, unit: np.dtype, local: np.ndarray,
            grid: np.ndarray, sel: np.ndarray | None) -> None:
    """One member's rows ``local`` into ``grid`` (at rows ``sel``, all if None)."""
    per_part = max(READ_BUDGET // isz, 1)  # rows of one column read at most at once (about)
    starts, ends = _ranges(local, max(MERGE_GAP // isz, 1))
    pieces = -(-(ends - starts) // per_part)  # a stretch longer than that is cut
    if int(pieces.max()) > 1:
        idx = np.repeat(np.arange(len(starts)), pieces)
        off = np.arange(len(idx)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        starts = starts[idx] + off * per_part
        ends = np.minimum(starts + per_part, ends[idx])
    base = np.concatenate(([0], np.cumsum(ends - starts)))
    which = np.searchsorted(starts, local, side="right") - 1
    pos = base[which] + (local - starts[which])  # the row's place in one column's stretches
    bucket = base[:-1] // per_part  # parts of the stretches of at most twice per_part rows
    edges = np.concatenate(([0], np.flatnonzero(np.diff(bucket)) + 1, [len(starts)]))
    part_of = np.searchsorted(base[edges[1:-1]], pos, side="right")
    order = np.argsort(part_of, kind="stable")
    bounds = np.searchsorted(part_of[order], np.arange(len(edges)))
    for p in range(len(edges) - 1):
        a, b = int(edges[p]), int(edges[p + 1])
        at = order[bounds[p]: bounds[p + 1]]
        if not len(at):
            continue
        lo, rows = int(base[a]), int(base[b] - base[a])
        group = max(READ_BUDGET // (rows * isz), 1)
        dest = at if sel is None else sel[at]
        take = pos[at] - lo
        for c0 in range(0, ncol, group):
            c1 = min(c0 + group, ncol)
            col = np.arange(c0, c1, dtype=np.int64)[:, None] * n
            s = (data + (col + starts[a:b]) * isz).ravel()
            e = (data + (col + ends[a:b]) * isz).ravel()
            got = source.read_runs(s, e).view(unit).reshape(c1 - c0, rows)
            grid[dest, c0:c1] = got[:, take].T
