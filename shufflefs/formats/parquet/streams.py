"""A Parquet source's rows stored as a view's pages hold them, so that any row order is encoded by
copying runs: the *row streams* of a decoded copy of the file.

Per leaf column there is one stream of PLAIN value bytes (a BYTE_ARRAY value with its 4-byte
length prefix, a BOOLEAN value as one byte 0/1) and, where the leaf has levels, one stream of
definition and one of repetition levels (a byte per level entry), each over all rows in source
order.  A row's values are one run of its value stream and its entries one run of each level
stream, of the lengths the index holds (`sizes.RowSizes`), so where every stream and every source
row group's part of it lies follows from the index alone (`StreamLayout`, numpy sums): a copy
file is sized before its first byte is written and filled one source row group at a time, in any
order (`group_pieces`, checked row by row against the index).  Where a leaf's rows differ in size,
the copy also keeps where each row's run starts (8 bytes per row, in an offsets stream), so that a
view's pages are encoded from the copy by gathering their rows' offsets and copying one run per
row and stream (`encode_pages`), whatever the order: no per-value work, no pyarrow, nothing
kept in memory between windows, only the rows the chunk holds touched.

Why a copy and not the source: pyarrow decodes whole row groups, and an order that mixes a
sorted file's rows (every window draws rows from every stretch of the file) would decode nearly
every source row group for every window: measured on a 780 MiB file of 15 row groups, 16 windows
of 64 MiB decode 240 row groups per epoch instead of 15 (docs/benchmark.md).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...errors import FormatError
from ..base import FramingError
from .decode import LeafData
from .encode import _Chunk, _gather, copy_runs
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


class StreamLayout:
    """Where the streams of a source with ``footer`` and index ``sizes`` lie in a copy file.

    ``values[c]``, ``defs[c]``, ``reps[c]``: the offset of leaf c's streams (-1: none);
    ``value_offsets[c]``, ``entry_offsets[c]``: of its rows' run starts (int64 per row: a value
    run's offset in the copy, an entry run's index in the level streams; -1: every row alike);
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
        self.value_offsets = np.full(n_leaves, -1, np.int64)
        self.entry_offsets = np.full(n_leaves, -1, np.int64)
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
            if isinstance(col.values, np.ndarray):
                self.value_offsets[c] = place(8 * sizes.n_rows)
            if isinstance(col.entries, np.ndarray):
                self.entry_offsets[c] = place(8 * sizes.n_rows)
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
        rows = int(self.sizes.group_starts[g + 1] - self.sizes.group_starts[g])
        return int(v.sum() + 2 * e.sum()) + 16 * rows * len(cols)


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


def _before(per_row: np.ndarray | int | None, a: int, b: int) -> int:
    """The sum of ``per_row`` over rows ``[a, b)`` (None: one per row)."""
    if per_row is None:
        return b - a
    if isinstance(per_row, int):
        return per_row * (b - a)
    return int(per_row[a:b].sum(dtype=np.int64))


def group_pieces(layout: StreamLayout, g: int, leaves: Sequence[Leaf], datas: Sequence[LeafData],
                 path: str, first: int | None = None) -> list[tuple[int, np.ndarray]]:
    """``(copy offset, bytes)`` of the streams of ``leaves`` in rows ``[first, first + n)`` of
    source row group ``g`` (n: the rows ``datas`` decode; ``first`` None: they are the whole
    group), from their decoded data; every row's value bytes and level entries are checked
    against the index first (`FormatError`: the source is not the indexed one)."""
    sizes = layout.sizes
    g0, g1 = int(sizes.group_starts[g]), int(sizes.group_starts[g + 1])
    n = datas[0].rows if datas else g1 - g0
    whole = first is None
    first = 0 if first is None else first
    a, b = g0 + first, g0 + first + n
    offset = layout.footer.group_offsets[g] if g < len(layout.footer.group_offsets) else None
    if first < 0 or b > g1 or (whole and b != g1):
        raise FramingError(path, offset, f"row group {g}: rows {first}-{first + n} decoded where the index has "
                           f"{g1 - g0}: the rows are not the index's, the index does not fit the file")
    rows = np.arange(a, b, dtype=np.int64)
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
        v0 = int(layout.values[c] + layout.group_values[g, c]) + _before(col.values, g0, a)
        e0 = int(layout.group_entries[g, c]) + _before(col.entries, g0, a)
        stream = _value_stream(leaf, data, path)
        if len(stream) != _before(col.values, a, b):
            raise FormatError(path, offset, f"column {leaf.dotted}, row group {g}: {len(stream)} value bytes, "
                              "the index says otherwise")
        out.append((v0, stream))
        for at, per_row, start in ((layout.value_offsets[c], col.values, v0), (layout.entry_offsets[c], col.entries, e0)):
            if at >= 0 and b > a:
                starts = np.empty(b - a, np.int64)
                starts[0] = start
                np.cumsum(per_row[a: b - 1], out=starts[1:], dtype=np.int64)
                starts[1:] += start
                out.append((int(at) + 8 * a, starts.view(np.uint8)))
        for base, levels in ((layout.defs[c], data.defs), (layout.reps[c], data.reps)):
            if base >= 0:
                if levels is None or len(levels) != _before(col.entries, a, b):
                    raise FormatError(path, offset, f"column {leaf.dotted}, row group {g}: levels that are not "
                                      "the index's")
                out.append((int(base) + e0, np.ascontiguousarray(levels, np.uint8)))
    return out


class RowStreams:
    """The streams of a copy, mapped (``data``: its bytes, uint8), and where any row's runs lie."""

    def __init__(self, layout: StreamLayout, data: np.ndarray) -> None:
        self.layout, self.data = layout, data
        n = layout.sizes.n_rows

        def int64s(at: int) -> np.ndarray | None:
            return None if at < 0 else data[at: at + 8 * n].view(np.int64)

        self._voff = [int64s(int(at)) for at in layout.value_offsets]
        self._eoff = [int64s(int(at)) for at in layout.entry_offsets]

    def runs(self, c: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Leaf c's run starts by source row: of its values (offsets in ``data``) and of its
        entries (indexes in its level streams); None where every row's is alike."""
        return self._voff[c], self._eoff[c]

    def offsets(self, c: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For source ``rows`` (any order), the offset in ``data`` of each one's value run of leaf
        c, and the index of its entry run in the leaf's level streams (int64 each)."""
        col = self.layout.sizes.columns[c]
        voff, eoff = self._voff[c], self._eoff[c]
        v = self.layout.values[c] + rows * col.values if voff is None else voff[rows]
        if col.entries is None:
            e = rows
        else:
            e = rows * col.entries if eoff is None else eoff[rows]
        return v, e


def encode_pages(view: ViewLayout, g: int, c: int, rows: np.ndarray, streams: RowStreams, out: np.ndarray,
                 pages: range | None = None, path: str = "", skip_values: bool = False) -> np.ndarray:
    """The bytes of pages ``pages`` (default: all) of column chunk c of row group ``g`` of ``view``
    into ``out``, from the row streams of a copy holding every source row group their rows are
    in; ``rows``: the row group's source rows, in view order.  ``skip_values``: the leaf's value
    runs are left out (`value_places` says where they go; `stages.parquet_scatter` puts them)."""
    cp = view.columns[c]
    if pages is None:
        pages = range(int(cp.first[g]), int(cp.first[g + 1]))
    if len(rows) != int(view.group_bounds[g + 1] - view.group_bounds[g]):
        raise ValueError(f"row group {g} holds {int(view.group_bounds[g + 1] - view.group_bounds[g])} rows")
    if not len(pages):
        return out[:0]
    base = int(cp.offset[pages.start])
    size = int(cp.offset[pages.stop - 1] + cp.total[pages.stop - 1]) - base
    if len(out) < size:
        raise ValueError(f"pages {pages} of column chunk {c} of row group {g} take {size} bytes, the buffer {len(out)}")
    out = out[:size]
    rows, chunk = _pages_chunk(view, g, c, rows, pages)
    sizes, lay, data = view.sizes, streams.layout, streams.data
    leaf, col = view.footer_src.leaves[c], sizes.columns[c]
    w = uniform_width(leaf, col, sizes.booleans[c])
    where = f"column {leaf.dotted}, row group {g}"
    v_runs, e_runs = streams.runs(c)
    levels = [(stage, at) for stage, at in ((chunk.defs, lay.defs[c]), (chunk.reps, lay.reps[c])) if stage is not None]
    if levels and e_runs is not None and _gather is not None:  # each row's run of entries, page after page
        n = int(lay.group_entries[-1, c])
        _gather_pages(levels[0][0], data[int(levels[0][1]): int(levels[0][1]) + n], rows, e_runs, col.entries,  # type: ignore[arg-type]
                      chunk.page_rows, None, chunk.page_entries[1:], where, path,
                      *((levels[1][0], data[int(levels[1][1]): int(levels[1][1]) + n]) if len(levels) > 1 else ()))
        levels = []
    for stage, at in levels:
        if col.entries is None:  # one level entry a row: the rows index the level stream
            np.take(data[int(at): int(at) + sizes.n_rows], rows, out=stage)
        else:
            e_off = streams.offsets(c, rows)[1]
            copy_runs(stage, chunk.E[:-1], data, e_off + at, np.diff(chunk.E))
    if w:  # every row w bytes: each page's values are the rows' items of the value stream, in order
        item = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(w, np.dtype((np.void, w)))
        values = data[int(lay.values[c]): int(lay.values[c]) + w * sizes.n_rows].view(item)
        for i, p in enumerate(pages):
            a, b = int(cp.row_start[p]) - chunk.rows0, int(cp.row_end[p]) - chunk.rows0
            at = int(chunk.val_start[i])
            np.take(values, rows[a:b], out=out[at: at + w * (b - a)].view(item))
    elif skip_values:
        if chunk.boolean or v_runs is None:
            raise ValueError(f"column chunk {c}: only runs of variable width are left out")
    elif chunk.boolean:
        copy_runs(chunk.bits, chunk.V[:-1], data, streams.offsets(c, rows)[0], np.diff(chunk.V))  # type: ignore[arg-type]
    elif v_runs is not None and _gather is not None:  # each row's run of values, page after page
        page = np.arange(pages.start, pages.stop)
        _gather_pages(out, data, rows, v_runs, col.values, chunk.page_rows, chunk.val_start,  # type: ignore[arg-type]
                      chunk.val_start + cp.values[page], where, path)
    else:
        copy_runs(out, chunk.value_dst, data, streams.offsets(c, rows)[0], np.diff(chunk.V))  # type: ignore[arg-type]
    chunk.finish(out, base, where, path)
    return out


def value_places(view: ViewLayout, g: int, c: int, rows: np.ndarray, pages: range) -> tuple[np.ndarray, np.ndarray]:
    """The source rows of pages ``pages`` of column chunk c of row group ``g`` (``rows``: the row
    group's, in view order) and where each one's value run goes in the view."""
    rows, chunk = _pages_chunk(view, g, c, rows, pages)
    return rows, chunk.value_dst + int(view.columns[c].offset[pages.start])  # type: ignore[operator]


def _pages_chunk(view: ViewLayout, g: int, c: int, rows: np.ndarray, pages: range) -> tuple[np.ndarray, _Chunk]:
    """The rows of pages ``pages`` (of the row group's ``rows``) and their `_Chunk`, placed from
    the first page's first byte."""
    cp = view.columns[c]
    first = int(view.group_bounds[g])
    rows = np.ascontiguousarray(rows[int(cp.row_start[pages.start]) - first: int(cp.row_end[pages.stop - 1]) - first],
                                np.int64)
    sizes = view.sizes
    col = sizes.columns[c]
    return rows, _Chunk(view.footer_src.leaves[c], cp, g, rows, int(cp.offset[pages.start]), col.values, col.entries,
                        sizes.booleans[c], pages)


def _gather_pages(out: np.ndarray, src: np.ndarray, rows: np.ndarray, runs: np.ndarray, per_row: np.ndarray,
                  page_rows: np.ndarray, dst: np.ndarray | None, ends: np.ndarray, where: str, path: str,
                  *also: np.ndarray) -> None:
    """Copy the runs of ``rows`` (starts ``runs``, lengths ``per_row``, by source row) page after
    page into ``out``, each page from ``dst`` (None: where the one before ended), checking that
    each page ends at ``ends`` (the layout's: else the copy is not the index's); ``also``: another
    (out, src) pair with the same runs, copied in the same pass."""
    got = np.empty(len(page_rows) - 1, np.int64)
    per_row = np.ascontiguousarray(per_row)
    if per_row.dtype.kind != "u":
        per_row = per_row.astype(np.uint64)
    none = np.zeros(0, np.int64)
    _gather.gather_rows(out, src, rows, runs, per_row, per_row.itemsize, page_rows,
                        none if dst is None else np.ascontiguousarray(dst, np.int64), got, *also)
    if not np.array_equal(got, ends):
        bad = int(np.argmax(got != ends))
        raise FormatError(path, None, f"{where}: page {bad}'s runs end at {int(got[bad])}, the layout's at "
                          f"{int(ends[bad])}: the copy is not the index's")


def uniform_width(leaf: Leaf, col: ColumnSizes, boolean: bool) -> int:
    """Value bytes of every row of a leaf whose rows all have one level entry and the same
    value bytes (a fixed-width column without nulls; 0 for any other): each of its pages is
    encoded by indexing the copy's value stream with the page's rows (`encode_pages`), where the
    general way copies one run of a few bytes per row."""
    if boolean or leaf.max_rep or not isinstance(col.values, int) or col.values <= 0:
        return 0
    return col.values if col.entries in (None, 1) else 0


def encode_rows(view: ViewLayout, g: int, rows: np.ndarray, streams: RowStreams, out: np.ndarray,
                path: str = "") -> np.ndarray:
    """The bytes of row group ``g`` of ``view`` (all its column chunks, `encode_pages`) into ``out``."""
    start, end = view.group_range(g)
    if len(out) < end - start:
        raise ValueError(f"row group {g} takes {end - start} bytes, the buffer {len(out)}")
    for c in range(len(view.footer_src.leaves)):
        at = int(view.chunk_offset[g, c]) - start
        encode_pages(view, g, c, rows, streams, out[at: at + int(view.chunk_size[g, c])], path=path)
    return out[: end - start]
