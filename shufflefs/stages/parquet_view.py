"""A Parquet file's view for one epoch: the plan's windows as the view's row groups.

A plan orders a Parquet file's rows (its records, `formats.parquet.index`) in windows, as it
orders any file's records.  The view is ``PAR1 | row groups | footer``: each plan window is one
row group, or several when it holds more than `ROW_GROUP_BYTES` of rows or `ROW_GROUP_ROWS` rows,
so that a reader never holds more than that at once.  `ParquetLayout` places every row group and
the footer from the index alone (`formats.parquet.layout.plan_view`), so the view's size and
footer are known when it is planned and a reader reads them without any row group being encoded.

What the mount loads and keeps in memory (its windows) are not whole row groups but runs of pages
of about `WINDOW_BYTES` (`page_windows`): a large column chunk's pages cut every 8 MiB, the small
chunks between large ones together, never two row groups in one window.  Parquet readers read a
row group's columns as separate ranges, from several threads, one row group ahead (pyarrow's
``iter_batches`` reads the small columns of row group k+1 while it reads the large one of row
group k), and hint every range they will read at once (``POSIX_FADV_WILLNEED``, upon which the
kernel asks for the start of each).  Measured on a 780 MiB file of 13 view row groups of 64 MiB:
with whole row groups as windows a reader's window was dropped for others while it still read it
and loaded again, 36 loads through ``iter_batches``, 76 through ``read_table``; with column
chunks as windows (buffers are all as large as a view's largest window, so three windows of
any size fit) 98 loads for 39 chunks; with 8 MiB windows 150 loads for 104 windows, the
reloads being the starts of ranges the hints asked for long before they were read.  Windows of
8 MiB also keep the mount's memory at three of them, not three row groups.
`ParquetView.load_window` encodes one window from the file's decoded copy
(`stages.parquet_rows`), copying the source row groups its rows are in into it first if they
are not there yet.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterator

import numpy as np

from ..formats.base import FramingError
from ..formats.parquet.index import ParquetIndex
from ..formats.parquet.layout import ViewLayout, plan_view
from ..formats.parquet.streams import encode_pages, value_places
from ..sources.base import Source
from ..strategies.base import Plan
from ..windows.layout import Layout
from .parquet_rows import RowCopy

ROW_GROUP_BYTES = 128 << 20
"""The most record bytes (the rows' PLAIN values) a view's row group holds: a window of the
default 64 MiB buffer is one row group, a larger buffer's windows are cut into row groups of at
most this, about what Spark writes (128 MiB) and less than the 1 Mi rows pyarrow writes of wide
rows.  What a reader holds at once (pyarrow, polars and duckdb decode a row group at a time per
thread)."""
ROW_GROUP_ROWS = 1 << 20
"""The most rows a view's row group holds (pyarrow's default when it writes)."""
WORK_PER_ROW = 96
"""Bytes per row of a run of pages a window load works with besides the window: the rows' offsets
in the copy, the column's prefix sums and places over them, their levels."""
KEPT_WINDOWS = 2
"""Plan windows whose row ids a view keeps (8 bytes per row) for the next chunks it loads, and
one more for peeks (`ParquetView.peek`): the kernel's peeks come in runs over one row group's
column chunks, and working out a plan window's ids again cost as much as encoding the pages."""


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


WINDOW_BYTES = 8 << 20
"""About the bytes of a window: a column chunk's pages are cut into windows where their offset in
the chunk passes a multiple of this (a window ends with the page that crosses it), and the
chunks smaller than a quarter of it between two larger ones of a row group are cut so together."""


def page_windows(view: ViewLayout, target: int = WINDOW_BYTES) -> tuple[np.ndarray, ...]:
    """The windows of a view's pages, in file order: each window's row group and first run of
    pages (windows + 1), and each run's column, first page and end page (runs of consecutive pages
    of one column chunk).  A window never holds pages of two row groups, nor of a large chunk and
    another: readers read column chunks as separate ranges, and a window shared by two ranges
    read apart in time is loaded twice."""
    n_groups = view.n_groups
    parts = [(cp.offset, np.full(len(cp.total), c, np.int64), np.arange(len(cp.total), dtype=np.int64),
              np.repeat(np.arange(n_groups, dtype=np.int64), np.diff(cp.first))) for c, cp in enumerate(view.columns)]
    if not n_groups or not parts:
        none = np.zeros(0, np.int64)
        return none, np.zeros(1, np.int64), none, none, none
    off, col, page, group = (np.concatenate(a) for a in zip(*parts))
    order = np.argsort(off, kind="stable")
    off, col, page, group = off[order], col[order], page[order], group[order]
    large = view.chunk_size[group, col] >= target // 4
    new_segment = np.ones(len(off), bool)  # one large chunk, or the small chunks between large ones
    new_segment[1:] = (group[1:] != group[:-1]) | (large[1:] != large[:-1]) | (large[1:] & (col[1:] != col[:-1]))
    segment = np.cumsum(new_segment) - 1
    key = segment * (int(view.size) // target + 2) + (off - off[new_segment][segment]) // target
    new_window = np.ones(len(off), bool)
    new_window[1:] = key[1:] != key[:-1]
    new_run = new_window.copy()
    new_run[1:] |= (col[1:] != col[:-1]) | (page[1:] != page[:-1] + 1)
    runs = np.flatnonzero(new_run)
    run_end = np.append(runs[1:], len(off))
    window_runs = np.searchsorted(runs, np.flatnonzero(new_window))
    return (group[np.flatnonzero(new_window)], np.append(window_runs, len(runs)), col[runs], page[runs],
            page[run_end - 1] + 1)


class ParquetLayout(Layout):
    """Virtual offsets of a Parquet view: ``PAR1`` as its header, runs of its pages as windows
    (module docstring), the footer as its trailer.  ``view`` is the `ViewLayout` of every page;
    row group g holds rows ``[group_first[g], +rows)`` of plan window ``group_window[g]``; window
    w is runs ``[window_runs[w], window_runs[w + 1])`` of row group ``window_group[w]``, run r
    pages ``[run_first[r], run_end[r])`` of column ``run_col[r]``."""

    def __init__(self, index: ParquetIndex, plan: Plan, header_size: int | None = None,
                 trailer_size: int | None = None, path: str = "") -> None:
        """``header_size``/``trailer_size`` are the format's own (taken for `Layout`'s signature)."""
        self.index, self.plan = index, plan
        ids = [plan.window(k) for k in range(plan.n_windows)]  # ids as the plan keeps them: one int64 copy below
        window_rows = np.array([len(w) for w in ids], np.int64)
        window_bytes = np.asarray(plan.window_sizes, np.int64)
        self.max_window_rows = int(window_rows.max(initial=0))
        rows = group_rows(window_rows, window_bytes)
        per_window = np.where(window_rows > 0, np.maximum(np.maximum(-(-window_bytes // ROW_GROUP_BYTES),
                                                                     -(-window_rows // ROW_GROUP_ROWS)), 1), 0)
        order = np.empty(int(window_rows.sum()), np.int64)
        if ids:
            np.concatenate(ids, out=order, casting="safe")
        del ids
        self.view: ViewLayout = plan_view(index.footer, index.sizes, order, rows, path)
        self.view.order = np.zeros(0, np.int64)  # a row group's rows come from the plan when it loads
        self.order: np.ndarray | None = order
        """Every row in view order, until the first view made of this layout takes it (`ParquetView`)."""
        self.plan_first = np.zeros(plan.n_windows + 1, np.int64)
        np.cumsum(window_rows, out=self.plan_first[1:])
        bounds = self.view.group_bounds
        self.group_window = np.repeat(np.arange(plan.n_windows, dtype=np.int64), per_window)
        first_group = np.zeros(plan.n_windows + 1, np.int64)
        np.cumsum(per_window, out=first_group[1:])
        self.group_first = bounds[:-1] - bounds[first_group[:-1]][self.group_window]
        self.window_group, self.window_runs, self.run_col, self.run_first, self.run_end = page_windows(self.view, WINDOW_BYTES)
        starts = np.empty(len(self.window_group) + 1, np.int64)
        first_col = self.run_col[self.window_runs[:-1]]
        starts[:-1] = np.array([self.view.columns[c].offset[p] for c, p in
                                zip(first_col.tolist(), self.run_first[self.window_runs[:-1]].tolist())], np.int64)
        starts[-1] = self.view.tail_start
        run_rows = np.array([self.view.columns[c].row_end[e - 1] - self.view.columns[c].row_start[f] for c, f, e in
                             zip(self.run_col.tolist(), self.run_first.tolist(), self.run_end.tolist())], np.int64)
        self.window_rows = (np.maximum.reduceat(run_rows, self.window_runs[:-1]) if len(run_rows)
                            else np.zeros(0, np.int64))
        """The most rows a run of pages of each window holds (what its load works on at once)."""
        self.header_size = len(self.view.head)
        self.trailer_size = len(self.view.tail)
        self.window_starts = starts
        self.trailer_offset = self.view.tail_start
        self.size = self.view.size

    def group_rows(self, g: int) -> int:
        return int(self.view.group_bounds[g + 1] - self.view.group_bounds[g])

    @property
    def group_bytes(self) -> int:
        """Bytes of the view's largest row group (its memory is counted in row groups)."""
        ends = np.append(self.view.chunk_offset[1:, 0], self.view.tail_start) if self.view.n_groups else np.zeros(0)
        return int((ends - self.view.chunk_offset[:, 0]).max(initial=0)) if self.view.n_groups else 0

    def ahead(self, k: int, n: int) -> int:
        """Windows after window k that a sequential reader's loads cover: as many as hold the
        largest row group (at least ``n``), so that the next row group is ready when a reader
        gets to it (memory is counted in row groups: `group_bytes`)."""
        sizes = np.diff(self.window_starts)[k + 1: k + 1 + 256]
        return max(n, int(np.searchsorted(np.cumsum(sizes), self.group_bytes, side="right")))

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
        self._lock = threading.Lock()
        self._ids: OrderedDict[int, np.ndarray] = OrderedDict()  # plan windows' row ids, the last few
        self._peeked: tuple[int, np.ndarray] | None = None  # the last peek's plan window and its ids
        self.stage = None  # its stage file, when the kernel reads it (`serve.passthrough`)
        self.unstaged = False  # served by the daemon even so (no room for a stage when first opened)
        self.writer = None  # the `StageWriter` of its stage while it is being written
        self.early = 0  # handles that read the stage as it is written (`serve.early_opens`)
        self.closers: list[Callable[[], None]] = []  # what goes with the view
        self._order, layout.order = (layout.order if plan is layout.plan else None), None
        """The layout's rows in view order, kept while the view is encoded whole into its stage
        (`drop_order`): each plan window's ids are then read from it instead of shuffled again."""

    @property
    def size(self) -> int:
        return self.layout.size

    def work(self, k: int | None = None) -> int:
        """Bytes a load of window k (None: the largest) works with besides the window: the rows of
        its runs of pages one after the other, the row ids of the plan windows kept, and while
        the copy is not filled yet, filling it."""
        lay = self.layout
        rows = lay.window_rows
        most = int(rows[k]) if k is not None else int(rows.max(initial=0))
        return WORK_PER_ROW * most + 8 * (KEPT_WINDOWS + 1) * lay.max_window_rows + self.copy.work()

    def rows(self, g: int, keep: bool = True) -> np.ndarray:
        """The source rows of row group g, in view order (its plan window's ids, kept for the
        window's other chunks and row groups unless ``keep`` is False: a peek far from the
        readers does not push out the ids of the windows they load in turn)."""
        lay = self.layout
        k = int(lay.group_window[g])
        with self._lock:
            ids = self._ids.get(k)
            if ids is not None and keep:
                self._ids.move_to_end(k)
            elif ids is None and not keep and self._peeked is not None and self._peeked[0] == k:
                ids = self._peeked[1]
        if ids is None and self.writer is None:
            self._order = None  # loaded for a reader, not for a stage: it would only hold memory
        order = self._order
        if ids is None and order is not None:
            ids = order[int(lay.plan_first[k]): int(lay.plan_first[k + 1])]
        elif ids is None:
            ids = np.asarray(self.plan.window(k), np.int64)
            if not keep:
                with self._lock:
                    self._peeked = (k, ids)
                a = int(lay.group_first[g])
                return ids[a: a + lay.group_rows(g)]
            with self._lock:
                self._ids[k] = ids
                while len(self._ids) > KEPT_WINDOWS:
                    self._ids.popitem(last=False)
        a = int(lay.group_first[g])
        return ids[a: a + lay.group_rows(g)]

    def load_window(self, k: int, out: np.ndarray | None = None, scratch: np.ndarray | None = None,
                    ahead: bool = False, plan: Plan | None = None, skip: int = -1
                    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Window k's bytes (its pages), built in ``out`` if it is large enough (blocking); the
        values of leaf ``skip`` left out (`parquet_scatter` puts them in place)."""
        if plan is not None and plan is not self.plan:
            raise ValueError("a Parquet view loads its own plan's windows")
        self.source.check()
        lay = self.layout
        size = lay.window_size(k)
        if out is None or len(out) < size:
            out = np.empty(size, np.uint8)
        g = int(lay.window_group[k])
        rows = self.rows(g)
        self._fill(rows)
        if skip < 0:
            self.copy.warm()
        view, pos = lay.view, 0
        for r in range(int(lay.window_runs[k]), int(lay.window_runs[k + 1])):
            c = int(lay.run_col[r])
            got = encode_pages(view, g, c, rows, self.copy.streams, out[pos:size],
                               range(int(lay.run_first[r]), int(lay.run_end[r])), self.path,
                               skip_values=c == skip)
            pos += len(got)
        if pos != size:
            raise FramingError(self.path, None, f"window {k} encoded to {pos} bytes, planned {size}")
        if self.meter is not None:
            self.meter(size, 0)
        return out[:size], scratch

    def value_places(self, k: int, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Window k's source rows of leaf c and where each one's value run goes in the view
        (`parquet_scatter`)."""
        lay = self.layout
        g = int(lay.window_group[k])
        rows = self.rows(g, keep=False)
        got = [value_places(lay.view, g, c, rows, range(int(lay.run_first[r]), int(lay.run_end[r])))
               for r in range(int(lay.window_runs[k]), int(lay.window_runs[k + 1])) if int(lay.run_col[r]) == c]
        if not got:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([x for x, _ in got]), np.concatenate([y for _, y in got])

    def peek(self, k: int, lo: int, hi: int) -> np.ndarray:
        """Bytes ``[lo, hi)`` of window k, encoding only the pages they fall in (blocking): what a
        read far from any reader's window gets, instead of the whole window loaded.  Parquet
        readers hint every column chunk they will read at once (``POSIX_FADV_WILLNEED``), and the
        kernel asks for the start of each long before the reader gets there: loaded whole, those
        windows were dropped for others and loaded again when the reader came (docs/benchmark.md)."""
        lay = self.layout
        base = int(lay.window_starts[k])
        if not 0 <= lo <= hi <= lay.window_size(k):
            raise ValueError(f"bytes [{lo}, {hi}) are not in window {k} ({lay.window_size(k)} bytes)")
        out = np.empty(hi - lo, np.uint8)
        if hi == lo:
            return out
        self.source.check()
        g = int(lay.window_group[k])
        rows = self.rows(g, keep=False)
        self._fill(rows)
        self.copy.warm()
        view = lay.view
        a, b = base + lo, base + hi
        for r in range(int(lay.window_runs[k]), int(lay.window_runs[k + 1])):
            c = int(lay.run_col[r])
            cp = view.columns[c]
            first, end = int(lay.run_first[r]), int(lay.run_end[r])
            starts = cp.offset[first:end]
            ends = starts + cp.total[first:end]
            hit = np.flatnonzero((starts < b) & (ends > a))
            if not len(hit):
                continue
            p0, p1 = first + int(hit[0]), first + int(hit[-1]) + 1
            pages = encode_pages(view, g, c, rows, self.copy.streams,
                                 np.empty(int(cp.offset[p1 - 1] + cp.total[p1 - 1] - cp.offset[p0]), np.uint8),
                                 range(p0, p1), self.path)
            at = int(cp.offset[p0])
            x, y = max(a, at), min(b, at + len(pages))
            out[x - a: y - a] = pages[x - at: y - at]
        if self.meter is not None:
            self.meter(hi - lo, 0)
        return out

    def _fill(self, rows: np.ndarray) -> None:
        """Copy the source row groups ``rows`` are in, if the copy lacks any."""
        try:
            if not self.copy.complete:
                self.copy.ensure(self.index.sizes.group_of(rows), self.source)
        except FramingError:
            if self.distrust is not None:
                self.distrust(self.index)
            raise

    def hint(self, k: int, plan: Plan | None = None) -> None:
        """Nothing to hint: a window reads its copy, copied from the source when first needed."""

    def ids_in_order(self) -> Iterator[np.ndarray]:
        """Every row's source id in view order (int64), a plan window at a time: what a kept stage
        is known by (`stages.stage_keys`)."""
        order, lay = self._order, self.layout
        for k in range(self.plan.n_windows):
            if order is not None:
                yield order[int(lay.plan_first[k]): int(lay.plan_first[k + 1])]
            else:
                yield np.asarray(self.plan.window(k), np.int64)

    def drop_order(self) -> None:
        """The stage is written: plan windows are shuffled again for any later load."""
        self._order = None

    def close(self) -> None:
        self._order = None
        with self._closed:
            if not self._open:
                return
            self._open = False
        try:
            for close in self.closers:
                close()
            self._release()
        finally:
            self.source.close()
