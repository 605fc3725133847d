"""The bytes of a view's row group, encoded on demand from the source row groups holding its rows.

The layout (`layout.plan_view`) already fixed where every page and every row's values go, from
the index alone; encoding fills those places.  Source row groups are decoded one after the other
(memory: the output row group and one decoded source group at a time), and each one's rows are
copied into place as runs: a row's values are one run of PLAIN bytes (written straight into the
output buffer by the compiled gather, no Table.take, no Python loop over rows), its level entries
one run into a staging array that is bit-packed page by page at the end.

Before a source row's bytes are copied, its decoded sizes are compared with the index: a source
that is not the indexed one (changed, damaged, or another file) is a `FormatError` naming the
column, the row group and the source offset, and never a page of wrong bytes.
"""

from __future__ import annotations

import functools
from typing import BinaryIO, Callable

import numpy as np

from ...errors import FormatError
from .pages import bit_width, encode_levels, header, levels_size
from .decode import DecodedGroup, LeafData
from .footer import BYTE_ARRAY, Leaf
from .layout import ColumnPages, ViewLayout

try:
    from ... import _gather  # compiled at install time; optional
except ImportError:  # pragma: no cover - the numpy fallback below computes the same bytes
    _gather = None

Groups = Callable[[int], DecodedGroup]
"""Decoded source row group by number (`decode.SourceGroups`, or any cache of them)."""


def expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without the loop."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    first = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, np.int64) - first, lengths) + np.arange(total, dtype=np.int64)


def copy_runs(dst: np.ndarray, dst_pos: np.ndarray, src: np.ndarray, src_pos: np.ndarray,
              lengths: np.ndarray) -> None:
    """``dst[dst_pos[i]:+lengths[i]] = src[src_pos[i]:+lengths[i]]`` (uint8 arrays), every run
    checked to lie inside both buffers."""
    if len(lengths) == 0:
        return
    dst_pos, src_pos, lengths = (np.ascontiguousarray(a, np.int64) for a in (dst_pos, src_pos, lengths))
    if _gather is not None:
        _gather.gather(dst, src, dst_pos, src_pos, lengths)
        return
    if (int(lengths.min()) < 0 or int((dst_pos + lengths).max()) > len(dst) or int(dst_pos.min()) < 0
            or int((src_pos + lengths).max()) > len(src) or int(src_pos.min()) < 0):
        raise IndexError("a run outside its buffer")
    dst[expand(dst_pos, lengths)] = src[expand(src_pos, lengths)]


def _prefix(per_row: np.ndarray | int | None, rows: np.ndarray) -> np.ndarray:
    if per_row is None:
        per_row = 1
    if isinstance(per_row, int):
        return np.arange(0, (len(rows) + 1) * per_row, per_row, dtype=np.int64) if per_row else np.zeros(
            len(rows) + 1, np.int64)
    cs = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(per_row[rows], out=cs[1:], dtype=np.int64)
    return cs


class _Chunk:
    """One column chunk being filled: where each row's entries and values go."""

    def __init__(self, leaf: Leaf, cp: ColumnPages, g: int, rows: np.ndarray, base: int,
                 values: np.ndarray | int, entries: np.ndarray | int | None, boolean: bool,
                 pages: range | None = None) -> None:
        """``pages``: only these pages of the chunk (``rows`` are theirs, ``base`` where the first
        one starts); default: all of row group ``g``'s."""
        self.leaf, self.cp, self.boolean = leaf, cp, boolean
        self.rows, self._entries, self._values = rows, entries, values
        self.pages = range(int(cp.first[g]), int(cp.first[g + 1])) if pages is None else pages
        self.rows0 = int(cp.row_start[self.pages.start])
        self.def_bits, self.rep_bits = bit_width(leaf.max_def), bit_width(leaf.max_rep)
        p = np.arange(self.pages.start, self.pages.stop)
        self.page_rows = np.append(cp.row_start[p], cp.row_end[p[-1]] if len(p) else self.rows0) - self.rows0
        """Each page's first row in ``rows``, and the end of the last page's."""
        self.page_entries = np.zeros(len(p) + 1, np.int64)
        np.cumsum(cp.entries[p], out=self.page_entries[1:])
        """Each page's first level entry in the chunk's, as the layout placed them."""
        total = int(self.page_entries[-1])
        self.defs = np.zeros(total, np.uint8) if self.def_bits else None
        self.reps = np.zeros(total, np.uint8) if self.rep_bits else None
        self.bits = np.zeros(int(self.V[-1]), np.uint8) if boolean else None
        self.val_start = (cp.offset[p] - base + cp.header[p] + levels_size(cp.entries[p], self.rep_bits)
                          + levels_size(cp.entries[p], self.def_bits))
        """Where each page's values start in the output."""

    @functools.cached_property
    def E(self) -> np.ndarray:
        """Each row's first level entry in the chunk's (rows + 1): the rows' entries, summed."""
        E = _prefix(self._entries, self.rows)
        if not np.array_equal(E[self.page_rows], self.page_entries):
            raise ValueError("the rows' level entries are not the layout's")
        return E

    @functools.cached_property
    def V(self) -> np.ndarray:
        """Each row's first value byte (booleans: value) in the chunk's (rows + 1)."""
        return _prefix(self._values, self.rows)

    @functools.cached_property
    def value_dst(self) -> np.ndarray | None:
        """Where each row's values start in the output (None for booleans, bit-packed per page)."""
        if self.boolean:
            return None
        cp, p = self.cp, np.arange(self.pages.start, self.pages.stop)
        p_rows = cp.row_end[p] - cp.row_start[p]
        return np.repeat(self.val_start - self.V[cp.row_start[p] - self.rows0], p_rows) + self.V[:-1]

    def fill(self, out: np.ndarray, data: LeafData, js: np.ndarray, r: np.ndarray, where: str,
             path: str, offset: int | None) -> None:
        """Copy source rows ``r`` (of ``data``) to the group's rows ``js``."""
        leaf = self.leaf
        want_e = self.E[js + 1] - self.E[js]
        got_e = data.entries(r)
        want_v = self.V[js + 1] - self.V[js]
        got_v = data.row_bytes(leaf)[r]
        if not (np.array_equal(want_e, got_e) and np.array_equal(want_v, got_v)):
            bad = int(np.argmax((want_e != got_e) | (want_v != got_v)))
            raise FormatError(path, offset, f"{where}: row {int(r[bad])} of the source has "
                              f"{int(got_v[bad])} value bytes and {int(got_e[bad])} level entries, the "
                              f"index {int(want_v[bad])} and {int(want_e[bad])}: the index does not fit the source")
        slot0 = r if data.slots is None else data.slots[r]
        for stage, src in ((self.defs, data.defs), (self.reps, data.reps)):
            if stage is not None:
                copy_runs(stage, self.E[js], src, slot0, got_e)  # type: ignore[arg-type]
        vals0 = r if data.vals is None else data.vals[r]
        counts = data.counts(r)
        v = data.values
        if self.boolean:
            copy_runs(self.bits, self.V[js], v.bits, vals0, counts)  # type: ignore[arg-type]
        elif leaf.physical != BYTE_ARRAY:
            w = leaf.width
            copy_runs(out, self.value_dst[js], v.fixed.reshape(-1), vals0 * w, counts * w)  # type: ignore[index,union-attr]
        else:
            vi = expand(vals0, counts)
            lens = v.lens[vi]  # type: ignore[index]
            within = np.zeros(len(lens) + 1, np.int64)  # PLAIN offsets of the values, all rows
            np.cumsum(lens + 4, out=within[1:])
            first = np.cumsum(counts) - counts  # each row's first value
            dst = np.repeat(self.value_dst[js] - within[first], counts) + within[:-1]  # type: ignore[index]
            prefix = lens.astype("<u4").view(np.uint8)
            copy_runs(out, dst, prefix, np.arange(len(lens), dtype=np.int64) * 4, np.full(len(lens), 4, np.int64))
            copy_runs(out, dst + 4, v.data, v.starts[vi], lens)  # type: ignore[arg-type,index]

    def finish(self, out: np.ndarray, base: int, where: str, path: str) -> None:
        """Write every page's header, levels and (booleans) values; check each against the plan."""
        cp = self.cp
        for i, p in enumerate(self.pages):
            a, b = int(cp.row_start[p]) - self.rows0, int(cp.row_end[p]) - self.rows0
            e0, e1 = int(self.page_entries[i]), int(self.page_entries[i + 1])
            body = int(cp.body[p])
            parts = [header(body, e1 - e0)]
            if self.reps is not None:
                parts.append(encode_levels(self.reps[e0:e1], self.rep_bits))
            if self.defs is not None:
                parts.append(encode_levels(self.defs[e0:e1], self.def_bits))
            if self.bits is not None:
                parts.append(np.packbits(self.bits[int(self.V[a]) : int(self.V[b])], bitorder="little").tobytes())
            head = b"".join(parts)
            values = int(cp.values[p]) if self.bits is None else 0
            if e1 - e0 != int(cp.entries[p]) or len(head) + values != int(cp.header[p]) + body:
                raise FormatError(path, None, f"{where}: page {p - self.pages.start} encodes to "
                                  f"{len(head) + values} bytes, planned {int(cp.header[p]) + body}")
            pos = int(cp.offset[p]) - base
            out[pos : pos + len(head)] = np.frombuffer(head, np.uint8)


def encode_group(layout: ViewLayout, g: int, groups: Groups, out: np.ndarray | None = None,
                 path: str = "") -> np.ndarray:
    """The bytes of row group ``g`` of the view (all its column chunks), in ``out`` if given (at
    least `ViewLayout.group_range` long) or a new array.  Decodes each source row group it draws
    from once, in ascending order, through ``groups``."""
    start, end = layout.group_range(g)
    size = end - start
    if out is None:
        out = np.empty(size, np.uint8)
    elif len(out) < size:
        raise ValueError(f"row group {g} takes {size} bytes, the buffer {len(out)}")
    out = out[:size]
    sizes, src = layout.sizes, layout.footer_src
    rows = layout.rows(g)
    src_g = sizes.group_of(rows)
    local = rows - sizes.group_starts[src_g]
    by_src = np.argsort(src_g, kind="stable")
    cuts = np.flatnonzero(np.diff(src_g[by_src])) + 1
    chunks = [_Chunk(leaf, layout.columns[c], g, rows, start, sizes.columns[c].values, sizes.columns[c].entries,
                     sizes.booleans[c]) for c, leaf in enumerate(src.leaves)]
    for js in np.split(by_src, cuts) if len(rows) else []:
        s = int(src_g[js[0]])
        offset = src.group_offsets[s] if s < len(src.group_offsets) else None
        dec = groups(s)
        if dec.digest != sizes.digest or dec.rows != int(sizes.group_starts[s + 1] - sizes.group_starts[s]):
            raise FormatError(path, offset, f"source row group {s} is not the one indexed (another version?)")
        r = local[js]
        for c, leaf in enumerate(src.leaves):
            chunks[c].fill(out, dec.leaves[c], js, r, f"column {leaf.dotted}, row group {g} (source {s})", path, offset)
        del dec
    for c, leaf in enumerate(src.leaves):
        chunks[c].finish(out, start, f"column {leaf.dotted}, row group {g}", path)
    return out


def write_view(layout: ViewLayout, groups: Groups, f: BinaryIO, path: str = "") -> int:
    """Write the whole view to ``f``; returns its size (always ``layout.size``)."""
    n = f.write(layout.head)
    for g in range(layout.n_groups):
        n += f.write(encode_group(layout, g, groups, path=path).data)
    n += f.write(layout.tail)
    if n != layout.size:
        raise FormatError(path, None, f"the view took {n} bytes, planned {layout.size}")
    return n


def view_bytes(layout: ViewLayout, groups: Groups, path: str = "") -> bytes:
    """The whole view in memory (tests, small files)."""
    import io

    buf = io.BytesIO()
    write_view(layout, groups, buf, path)
    return buf.getvalue()
