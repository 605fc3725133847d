"""A Parquet file's view for one epoch: the plan's windows as the view's row groups.

A plan orders a Parquet file's rows (its records, `formats.parquet.index`) in windows, as it
orders any file's records.  The view is ``PAR1 | row groups | footer``: each window is one row
group, or several when it holds more than `ROW_GROUP_BYTES` of rows or `ROW_GROUP_ROWS` rows, so
that a reader never holds more than that at once.  `ParquetLayout` places every row group and
the footer from the index alone (`formats.parquet.layout.plan_view`), so the view's size and
footer are known when it is planned and a reader reads them without any row group being
encoded.  `ParquetView.load_window` encodes one window's row groups from the file's decoded copy
(`stages.parquet_rows`), copying the source row groups the window draws from into it first if
they are not there yet.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..formats.base import FramingError
from ..formats.parquet.index import ParquetIndex
from ..formats.parquet.layout import ViewLayout, plan_view
from ..formats.parquet.streams import encode_rows
from ..sources.base import Source
from ..stages.parquet_rows import RowCopy
from ..strategies.base import Plan
from .layout import Layout

ROW_GROUP_BYTES = 128 << 20
"""The most record bytes (the rows' PLAIN values) a view's row group holds: a window of the
default 64 MiB buffer is one row group, a larger buffer's windows are cut into row groups of at
most this, about what Spark writes (128 MiB) and less than the 1 Mi rows pyarrow writes of wide
rows.  What a reader holds at once (pyarrow, polars and duckdb decode a row group at a time per
thread)."""
ROW_GROUP_ROWS = 1 << 20
"""The most rows a view's row group holds (pyarrow's default when it writes)."""
WORK_PER_ROW = 112
"""Bytes per row of a window a load works with besides the window: the window's row ids, their
source row groups and offsets in the copy, the column being encoded's prefix sums and places."""


def group_rows(window_rows: np.ndarray, window_bytes: np.ndarray) -> np.ndarray:
    """Rows of each row group, window after window: a window of rows is cut into the fewest equal
    row groups within `ROW_GROUP_BYTES` and `ROW_GROUP_ROWS` (an empty window: none)."""
    parts = np.maximum(-(-window_bytes // ROW_GROUP_BYTES), -(-window_rows // ROW_GROUP_ROWS))
    parts = np.where(window_rows > 0, np.maximum(parts, 1), 0)
    out = []
    for rows, k in zip(window_rows.tolist(), parts.tolist()):
        if k:
            base, extra = divmod(rows, k)
            out.append(np.full(k, base, np.int64) + (np.arange(k) < extra))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class ParquetLayout(Layout):
    """Virtual offsets of a Parquet view: ``PAR1`` as its header, its row groups window by window,
    the footer as its trailer (module docstring).  ``view`` is the `ViewLayout` of every page;
    ``window_groups`` (windows + 1) the first row group of each window."""

    def __init__(self, index: ParquetIndex, plan: Plan, header_size: int | None = None,
                 trailer_size: int | None = None, path: str = "") -> None:
        """``header_size``/``trailer_size`` are the format's own (taken for `Layout`'s signature)."""
        self.index, self.plan = index, plan
        ids = [np.asarray(plan.window(k), np.int64) for k in range(plan.n_windows)]
        window_rows = np.array([len(w) for w in ids], np.int64)
        window_bytes = np.asarray(plan.window_sizes, np.int64)
        rows = group_rows(window_rows, window_bytes)
        per_window = np.where(window_rows > 0, np.maximum(np.maximum(-(-window_bytes // ROW_GROUP_BYTES),
                                                                     -(-window_rows // ROW_GROUP_ROWS)), 1), 0)
        self.window_groups = np.zeros(plan.n_windows + 1, np.int64)
        np.cumsum(per_window, out=self.window_groups[1:])
        order = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        del ids
        self.view: ViewLayout = plan_view(index.footer, index.sizes, order, rows, path)
        self.view.order = np.zeros(0, np.int64)  # a window's rows come from the plan when it loads
        self.group_first = self.view.group_bounds[:-1] - np.repeat(self.view.group_bounds[self.window_groups[:-1]],
                                                                   per_window)
        n_groups = self.view.n_groups
        starts = np.empty(n_groups + 1, np.int64)
        starts[:n_groups] = self.view.chunk_offset[:, 0] if n_groups else 0
        starts[n_groups] = self.view.tail_start
        self.header_size = len(self.view.head)
        self.trailer_size = len(self.view.tail)
        self.window_starts = starts[self.window_groups]
        self.trailer_offset = self.view.tail_start
        self.size = self.view.size

    @property
    def nbytes(self) -> int:
        """Bytes the layout holds (its pages' arrays and the footer)."""
        cols = sum(a.nbytes for cp in self.view.columns for a in (cp.first, cp.row_start, cp.row_end, cp.entries,
                                                                    cp.values, cp.body, cp.header, cp.offset))
        return cols + 3 * self.view.chunk_size.nbytes + len(self.view.footer)


class ParquetView:
    """Layout + copy for one (file, epoch): turns window numbers into row groups' bytes.  The
    source is the file's version the index was built from, checked before every load; the copy
    is read through the `RowCopy` the view holds until it closes (``release``)."""

    def __init__(self, path: str, index: ParquetIndex, plan: Plan, layout: ParquetLayout, source: Source,
                 copy: RowCopy, release: Callable[[], None], meter: Callable[..., None] | None = None,
                 distrust: Callable[[ParquetIndex], None] | None = None) -> None:
        self.path, self.index, self.plan, self.layout = path, index, plan, layout
        self.source, self.copy, self._release = source, copy, release
        self.meter, self.distrust = meter, distrust
        self.header, self.trailer = layout.view.head, layout.view.tail
        self._closed = threading.Lock()
        self._open = True

    @property
    def size(self) -> int:
        return self.layout.size

    def work(self, k: int | None = None) -> int:
        """Bytes a load of window k (None: the largest) works with besides the window."""
        lay = self.layout
        rows = np.diff(lay.view.group_bounds[lay.window_groups]) if lay.n_windows else np.zeros(0, np.int64)
        most = int(rows[k] if k is not None else rows.max(initial=0))
        return WORK_PER_ROW * most + self.copy.work()

    def load_window(self, k: int, out: np.ndarray | None = None, scratch: np.ndarray | None = None,
                    ahead: bool = False, plan: Plan | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Window k's bytes (its row groups), built in ``out`` if it is large enough (blocking)."""
        if plan is not None and plan is not self.plan:
            raise ValueError("a Parquet view loads its own plan's windows")
        self.source.check()
        lay = self.layout
        size = lay.window_size(k)
        if out is None or len(out) < size:
            out = np.empty(size, np.uint8)
        ids = np.asarray(self.plan.window(k), np.int64)
        try:
            self.copy.ensure(self.index.sizes.group_of(ids), self.source)
        except FramingError:
            if self.distrust is not None:
                self.distrust(self.index)
            raise
        pos = 0
        view = lay.view
        for g in range(int(lay.window_groups[k]), int(lay.window_groups[k + 1])):
            a = int(lay.group_first[g])
            n = int(view.group_bounds[g + 1] - view.group_bounds[g])
            lo, hi = view.group_range(g)
            encode_rows(view, g, ids[a: a + n], self.copy.streams, out[pos: pos + hi - lo], self.path)
            pos += hi - lo
        if pos != size:
            raise FramingError(self.path, None, f"window {k} encoded to {pos} bytes, planned {size}")
        if self.meter is not None:
            self.meter(size, 0)
        return out[:size], scratch

    def hint(self, k: int, plan: Plan | None = None) -> None:
        """Nothing to hint: a window reads its copy, copied from the source when first needed."""

    def close(self) -> None:
        with self._closed:
            if not self._open:
                return
            self._open = False
        try:
            self._release()
        finally:
            self.source.close()
