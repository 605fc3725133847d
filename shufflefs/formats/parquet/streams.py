"""A Parquet source's rows stored as a view's pages hold them, so that any row order is encoded by
copying runs: the *row streams* of a decoded copy of the file.

Per leaf column there is one stream of PLAIN value bytes (a BYTE_ARRAY value with its 4-byte
length prefix, a BOOLEAN value as one byte 0/1) and, where the leaf has levels, one stream of
definition and one of repetition levels (a byte per level entry), each over all rows in source
order.  A row's values are one run of its value stream and its entries one run of each level
stream, of the lengths the index holds (`sizes.RowSizes`), so where every stream and every source
row group's part of it lies follows from the index alone (`StreamLayout`, numpy sums): a copy
file is sized before its first byte is written and filled one source row group at a time, in any
order (`group_pieces`, checked row by row against the index), and a view's row group is encoded
from it with one copy per stream and column (`encode_rows`), whatever the order: no per-value
work, no pyarrow, only the rows the row group holds are touched.

Why a copy and not the source: pyarrow decodes whole row groups, and an order that mixes a
sorted file's rows (every window draws rows from every stretch of the file) would decode nearly
every source row group for every window: measured on a 780 MiB file of 15 row groups, 16 windows
of 64 MiB decode 240 row groups per epoch instead of 15 (docs/benchmark.md).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from ...errors import FormatError
from ..base import FramingError
from .decode import LeafData
from .encode import _Chunk, copy_runs
from .footer import BOOLEAN, BYTE_ARRAY, Leaf, SourceFooter
from .layout import ViewLayout
from .sizes import ColumnSizes, RowSizes

ALIGN = 64


def _group_totals(per_row: np.ndarray | int | None, starts: np.ndarray) -> np.ndarray:
    """Per source row group, the sum of ``per_row`` over its rows (None: one per row)."""
    rows = np.diff(starts)
    if per_row is None:
        return rows
    if isinstance(per_row, int):
        return rows * per_row
    cs = np.zeros(len(per_row) + 1, np.int64)
    np.cumsum(per_row, out=cs[1:], dtype=np.int64)
    return cs[starts[1:]] - cs[starts[:-1]]


def _prefix(per_row: np.ndarray, a: int, b: int) -> np.ndarray:
    cs = np.zeros(b - a + 1, np.int64)
    np.cumsum(per_row[a:b], out=cs[1:], dtype=np.int64)
    return cs


class StreamLayout:
    """Where the streams of a source with ``footer`` and index ``sizes`` lie in a copy file.

    ``values[c]``, ``defs[c]``, ``reps[c]``: the offset of leaf c's streams (-1: none);
    ``group_values[g, c]`` and ``group_entries[g, c]``: where source row group g begins in leaf c's
    value stream and level streams, relative to their starts (groups + 1 rows)."""

    def __init__(self, footer: SourceFooter, sizes: RowSizes) -> None:
        self.footer, self.sizes = footer, sizes
        starts = sizes.group_starts
        n_leaves = len(footer.leaves)
        self.group_values = np.zeros((len(starts), n_leaves), np.int64)
        self.group_entries = np.zeros((len(starts), n_leaves), np.int64)
        self.values = np.full(n_leaves, -1, np.int64)
        self.defs = np.full(n_leaves, -1, np.int64)
        self.reps = np.full(n_leaves, -1, np.int64)
        pos = 0

        def place(n: int) -> int:
            nonlocal pos
            at = pos
            pos = -(-(pos + n) // ALIGN) * ALIGN
            return at

        for c, (leaf, col) in enumerate(zip(footer.leaves, sizes.columns)):
            np.cumsum(_group_totals(col.values, starts), out=self.group_values[1:, c])
            np.cumsum(_group_totals(col.entries, starts), out=self.group_entries[1:, c])
            self.values[c] = place(int(self.group_values[-1, c]))
            if leaf.max_def:
                self.defs[c] = place(int(self.group_entries[-1, c]))
            if leaf.max_rep:
                self.reps[c] = place(int(self.group_entries[-1, c]))
        self.size = pos

    def group_bytes(self, g: int) -> int:
        """Bytes source row group ``g`` takes in the copy."""
        v = self.group_values[g + 1] - self.group_values[g]
        e = self.group_entries[g + 1] - self.group_entries[g]
        return int(v.sum() + (e * ((self.defs >= 0).astype(np.int64) + (self.reps >= 0))).sum())

    def top_bytes(self, g: int, top: int) -> int:
        """Bytes of the streams of top-level column ``top`` in source row group ``g``."""
        cols = [leaf.index for leaf in self.footer.leaves if leaf.top == top]
        v = self.group_values[g + 1, cols] - self.group_values[g, cols]
        e = self.group_entries[g + 1, cols] - self.group_entries[g, cols]
        return int(v.sum() + 2 * e.sum())


def _value_stream(leaf: Leaf, data: LeafData, path: str) -> np.ndarray:
    """The leaf's PLAIN value bytes in value order (BYTE_ARRAY with length prefixes, BOOLEAN a
    byte per value)."""
    v = data.values
    if leaf.physical == BOOLEAN:
        return np.ascontiguousarray(v.bits, np.uint8)
    if leaf.physical != BYTE_ARRAY:
        return np.ascontiguousarray(v.fixed).reshape(-1)
    lens = np.asarray(v.lens, np.int64)
    pos = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens + 4, out=pos[1:])
    out = np.empty(int(pos[-1]), np.uint8)
    if len(lens):
        if int(lens.max()) > 0xFFFFFFFF:
            raise FormatError(path, None, f"column {leaf.dotted}: a value of more than 4 GiB")
        prefix = lens.astype("<u4").view(np.uint8)
        copy_runs(out, pos[:-1], prefix, np.arange(len(lens), dtype=np.int64) * 4, np.full(len(lens), 4, np.int64))
        copy_runs(out, pos[:-1] + 4, v.data, v.starts, lens)
    return out


def group_pieces(layout: StreamLayout, g: int, leaves: Sequence[Leaf], datas: Sequence[LeafData],
                 path: str) -> list[tuple[int, np.ndarray]]:
    """``(copy offset, bytes)`` of the streams of ``leaves`` in source row group ``g``, from their
    decoded data; every row's value bytes and level entries are checked against the index first
    (`FormatError`: the source is not the indexed one)."""
    sizes = layout.sizes
    a, b = int(sizes.group_starts[g]), int(sizes.group_starts[g + 1])
    rows = np.arange(a, b, dtype=np.int64)
    offset = layout.footer.group_offsets[g] if g < len(layout.footer.group_offsets) else None
    out = []
    for leaf, data in zip(leaves, datas):
        c = leaf.index
        col = sizes.columns[c]
        got_v, got_e = data.row_bytes(leaf), data.entries()
        want_v = np.broadcast_to(col.values_of(rows), (b - a,))
        want_e = np.broadcast_to(col.entries_of(rows), (b - a,))
        if data.rows != b - a or not (np.array_equal(got_v, want_v) and np.array_equal(got_e, want_e)):
            raise FramingError(path, offset, f"column {leaf.dotted}, row group {g}: the decoded rows' sizes are not "
                               "the index's: the index does not fit the file")
        stream = _value_stream(leaf, data, path)
        if len(stream) != int(layout.group_values[g + 1, c] - layout.group_values[g, c]):
            raise FormatError(path, offset, f"column {leaf.dotted}, row group {g}: {len(stream)} value bytes, "
                              "the index says otherwise")
        out.append((int(layout.values[c] + layout.group_values[g, c]), stream))
        e0 = int(layout.group_entries[g, c])
        for base, levels in ((layout.defs[c], data.defs), (layout.reps[c], data.reps)):
            if base >= 0:
                if levels is None or len(levels) != int(layout.group_entries[g + 1, c]) - e0:
                    raise FormatError(path, offset, f"column {leaf.dotted}, row group {g}: levels that are not "
                                      "the index's")
                out.append((int(base) + e0, np.ascontiguousarray(levels, np.uint8)))
    return out


class RowStreams:
    """The streams of a copy, mapped (``data``: its bytes, uint8), and where any row's runs lie.
    Each source row group's per-row offsets are computed when first needed and kept while they
    fit in ``keep_bytes`` (least recently used first out)."""

    def __init__(self, layout: StreamLayout, data: np.ndarray, keep_bytes: int = 64 << 20) -> None:
        self.layout, self.data, self.keep_bytes = layout, data, keep_bytes
        self._offsets: OrderedDict[int, list[tuple[np.ndarray | int, np.ndarray | None]]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def _group(self, s: int) -> list[tuple[np.ndarray | int, np.ndarray | None]]:
        """Per leaf of source row group ``s``: its rows' value offsets in the stream (relative to
        the group; an int: the constant bytes per row) and entry offsets (None: one per row)."""
        with self._lock:
            hit = self._offsets.get(s)
            if hit is not None:
                self._offsets.move_to_end(s)
                return hit
        sizes = self.layout.sizes
        a, b = int(sizes.group_starts[s]), int(sizes.group_starts[s + 1])
        got: list[tuple[np.ndarray | int, np.ndarray | None]] = []
        nbytes = 0
        for col in sizes.columns:
            v = col.values if isinstance(col.values, int) else _prefix(col.values, a, b)
            e = None
            if isinstance(col.entries, int):
                e = np.arange(b - a + 1, dtype=np.int64) * col.entries
            elif col.entries is not None:
                e = _prefix(col.entries, a, b)
            nbytes += sum(x.nbytes for x in (v, e) if isinstance(x, np.ndarray))
            got.append((v, e))
        with self._lock:
            if s not in self._offsets:
                self._offsets[s] = got
                self._held += nbytes
                while self._held > self.keep_bytes and len(self._offsets) > 1:
                    _, old = self._offsets.popitem(last=False)
                    self._held -= sum(x.nbytes for pair in old for x in pair if isinstance(x, np.ndarray))
        return got

    def rows(self, rows: np.ndarray) -> "RowRuns":
        """Where source ``rows`` (any order) lie in the streams, leaf by leaf (`RowRuns.leaf`)."""
        return RowRuns(self, rows)

    @property
    def held(self) -> int:
        """Bytes of row offsets kept."""
        return self._held


class RowRuns:
    """Source rows grouped by source row group once, for the offsets of every leaf in turn
    (16 bytes per row for the leaf asked, not for all leaves at once)."""

    def __init__(self, streams: RowStreams, rows: np.ndarray) -> None:
        sizes = streams.layout.sizes
        self.streams = streams
        self.src_g = sizes.group_of(rows)
        self.local = rows - sizes.group_starts[self.src_g]
        by = np.argsort(self.src_g, kind="stable")
        cuts = np.flatnonzero(np.diff(self.src_g[by])) + 1
        self.parts = [(int(self.src_g[js[0]]), js) for js in np.split(by, cuts)] if len(rows) else []

    def leaf(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Leaf c's absolute offsets in the copy of each row's value run, and of its entry runs
        relative to the starts of the leaf's level streams."""
        lay = self.streams.layout
        n = len(self.src_g)
        vo, eo = np.empty(n, np.int64), np.empty(n, np.int64)
        for s, js in self.parts:
            v, e = self.streams._group(s)[c]
            r = self.local[js]
            vo[js] = lay.values[c] + lay.group_values[s, c] + (r * v if isinstance(v, int) else v[r])
            eo[js] = lay.group_entries[s, c] + (r if e is None else e[r])
        return vo, eo


def encode_rows(view: ViewLayout, g: int, rows: np.ndarray, streams: RowStreams, out: np.ndarray,
                path: str = "") -> np.ndarray:
    """The bytes of row group ``g`` of ``view`` (source ``rows``, in view order) into ``out``, from
    the row streams of a copy holding every source row group these rows are in."""
    start, end = view.group_range(g)
    size = end - start
    if len(out) < size:
        raise ValueError(f"row group {g} takes {size} bytes, the buffer {len(out)}")
    out = out[:size]
    sizes, lay, data = view.sizes, streams.layout, streams.data
    if len(rows) != int(view.group_bounds[g + 1] - view.group_bounds[g]):
        raise ValueError(f"row group {g} holds {int(view.group_bounds[g + 1] - view.group_bounds[g])} rows")
    runs = streams.rows(rows)
    for c, leaf in enumerate(view.footer_src.leaves):
        col: ColumnSizes = sizes.columns[c]
        chunk = _Chunk(leaf, view.columns[c], g, rows, start, col.values, col.entries, sizes.booleans[c])
        v_off, e_off = runs.leaf(c)
        e_len = np.diff(chunk.E)
        for stage, base in ((chunk.defs, lay.defs[c]), (chunk.reps, lay.reps[c])):
            if stage is not None:
                copy_runs(stage, chunk.E[:-1], data, e_off + base, e_len)
        if chunk.boolean:
            copy_runs(chunk.bits, chunk.V[:-1], data, v_off, np.diff(chunk.V))  # type: ignore[arg-type]
        else:
            copy_runs(out, chunk.value_dst, data, v_off, np.diff(chunk.V))  # type: ignore[arg-type]
        chunk.finish(out, start, f"column {leaf.dotted}, row group {g}", path)
    return out
