"""A source row group decoded once into what both the index and the encoder read: per leaf
column, its level entries and PLAIN values, each row's entries and values as one run.

pyarrow decodes (any codec, encoding, page version, dictionary); `levels` and `values` turn its
arrays into Parquet's flat form.  Because rows never share level entries or values, a row of the
source is a run of entries and a run of values, so a view gathers rows by runs (`encode`) and
the index sums runs (`sizes`).  Imports pyarrow only inside functions.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ...errors import FormatError
from .footer import BOOLEAN, BYTE_ARRAY, Leaf, SourceFooter, footer_of_file, read_footer
from .levels import walk
from .values import Plain, plain_values


@dataclass
class LeafData:
    """One leaf column of a decoded row group.  ``slots``/``vals``: int64, rows + 1, the first
    level entry / present value of each row (None: exactly one per row); ``defs``/``reps``: uint8
    per entry (None where the column has no such levels); ``values``: the PLAIN values."""

    rows: int
    slots: np.ndarray | None
    defs: np.ndarray | None
    reps: np.ndarray | None
    vals: np.ndarray | None
    values: Plain
    _row_bytes: np.ndarray | None = field(default=None, repr=False)

    def entries(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Level entries of each of ``rows`` (all rows if None), int64."""
        if self.slots is None:
            return np.ones(self.rows if rows is None else len(rows), np.int64)
        d = np.diff(self.slots)
        return d if rows is None else d[rows]

    def counts(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Values of each of ``rows`` (all rows if None), int64."""
        if self.vals is None:
            return np.ones(self.rows if rows is None else len(rows), np.int64)
        d = np.diff(self.vals)
        return d if rows is None else d[rows]

    def row_bytes(self, leaf: Leaf) -> np.ndarray:
        """`value_bytes`, computed once (a source group may feed many of a view's row groups)."""
        if self._row_bytes is None:
            self._row_bytes = self.value_bytes(leaf)
        return self._row_bytes

    def value_bytes(self, leaf: Leaf) -> np.ndarray:
        """Each row's PLAIN value bytes (a BOOLEAN column: its number of values), int64."""
        if leaf.physical == BOOLEAN:
            return self.counts()
        if leaf.physical != BYTE_ARRAY:
            return self.counts() * leaf.width
        per_value = np.zeros(len(self.values) + 1, np.int64)
        np.cumsum(self.values.lens + 4, out=per_value[1:])
        if self.vals is None:
            return np.diff(per_value)
        return per_value[self.vals[1:]] - per_value[self.vals[:-1]]


def _concat(parts: Sequence[LeafData]) -> LeafData:
    """One `LeafData` of consecutive Arrow chunks of a row group."""
    if len(parts) == 1:
        return parts[0]

    def offsets(get: Callable[[LeafData], np.ndarray | None], count: Callable[[LeafData], int]) -> np.ndarray | None:
        if all(get(p) is None for p in parts):
            return None
        out, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            o = get(p)
            o = np.arange(p.rows + 1, dtype=np.int64) if o is None else o
            out.append(o[1:] + base)
            base += count(p)
        return np.concatenate(out)

    def cat(arrays: list) -> np.ndarray | None:
        return None if arrays[0] is None else np.concatenate(arrays)

    v = [p.values for p in parts]
    if v[0].data is not None:
        base = np.cumsum([0] + [len(x.data) for x in v[:-1]])  # type: ignore[arg-type]
        values = Plain(data=np.concatenate([x.data for x in v]),  # type: ignore[misc]
                       starts=np.concatenate([x.starts + b for x, b in zip(v, base)]),  # type: ignore[operator]
                       lens=np.concatenate([x.lens for x in v]))  # type: ignore[misc]
    else:
        values = Plain(fixed=cat([x.fixed for x in v]), bits=cat([x.bits for x in v]))
    return LeafData(sum(p.rows for p in parts),
                    offsets(lambda p: p.slots, lambda p: p.rows if p.slots is None else int(p.slots[-1])),
                    cat([p.defs for p in parts]), cat([p.reps for p in parts]),
                    offsets(lambda p: p.vals, lambda p: len(p.values)), values)


def leaf_data(leaf: Leaf, chunk: Any, path: str) -> LeafData:
    """`LeafData` of ``leaf`` over one Arrow chunk of its top-level column."""
    w = walk(leaf, chunk, path)
    vals = None
    if w.slots is not None or not w.present.all():
        cs = np.zeros(len(w.present) + 1, np.int64)
        np.cumsum(w.present, out=cs[1:])
        vals = cs if w.slots is None else cs[w.slots]
    return LeafData(w.rows, w.slots, w.defs, w.reps, vals, plain_values(leaf, w.leaf, w.index, path))


@dataclass
class DecodedGroup:
    """Source row group ``group``: its rows and one `LeafData` per leaf column."""

    group: int
    rows: int
    leaves: list[LeafData]
    digest: str


def decode_group(parquet_file: Any, footer: SourceFooter, group: int, path: str) -> DecodedGroup:
    """Decode row group ``group`` of an open ``pyarrow.parquet.ParquetFile`` whose footer is
    ``footer``.  Any failure of the decoder or mismatch with the footer is a `FormatError` naming
    the row group and its offset."""
    import pyarrow as pa

    offset = footer.group_offsets[group] if group < len(footer.group_offsets) else None
    try:
        table = parquet_file.read_row_groups([group], use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(path, offset, f"row group {group} cannot be decoded: {e}") from None
    if table.num_rows != footer.group_rows[group]:
        raise FormatError(path, offset, f"row group {group} decoded to {table.num_rows} rows, "
                          f"its footer says {footer.group_rows[group]}")
    if table.num_columns != len(footer.top) or table.column_names != [n.name for n in footer.top]:
        raise FormatError(path, offset, "the decoded columns are not the footer's top-level fields")
    leaves = []
    try:
        for leaf in footer.leaves:
            col = table.column(leaf.top)
            chunks = [leaf_data(leaf, c, path) for c in col.chunks if len(c)] or [leaf_data(leaf, _empty(col), path)]
            leaves.append(_concat(chunks))
    except FormatError as e:
        raise FormatError(path, offset, f"row group {group}: {e.message}") from None
    return DecodedGroup(group, table.num_rows, leaves, footer.digest)


def decode_top(parquet_file: Any, footer: SourceFooter, group: int, top: int, path: str) -> list[LeafData]:
    """The `LeafData` of the leaves of top-level column ``top`` in row group ``group``, as
    `decode_group` gives them, decoding that column's chunks only (memory: one column at a time)."""
    import pyarrow as pa

    offset = footer.group_offsets[group] if group < len(footer.group_offsets) else None
    leaves = [leaf for leaf in footer.leaves if leaf.top == top]
    try:
        table = parquet_file.reader.read_row_group(group, column_indices=[leaf.index for leaf in leaves],
                                                   use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(path, offset, f"row group {group} cannot be decoded: {e}") from None
    if table.num_rows != footer.group_rows[group]:
        raise FormatError(path, offset, f"row group {group} decoded to {table.num_rows} rows, "
                          f"its footer says {footer.group_rows[group]}")
    if table.num_columns != 1 or table.column_names[0] != footer.top[top].name:
        raise FormatError(path, offset, f"row group {group}: column {footer.top[top].name!r} is not the footer's")
    col = table.column(0)
    try:
        return [_concat([leaf_data(leaf, c, path) for c in col.chunks if len(c)] or [leaf_data(leaf, _empty(col), path)])
                for leaf in leaves]
    except FormatError as e:
        raise FormatError(path, offset, f"row group {group}: {e.message}") from None


def decode_top_batches(parquet_file: Any, footer: SourceFooter, group: int, top: int, path: str,
                       batch_rows: int) -> Iterator[tuple[int, list[LeafData]]]:
    """`decode_top` in batches of ``batch_rows`` rows: ``(first row in the group, the batch's
    LeafData per leaf)``, so that only one batch is decoded at a time (memory: the column chunk
    as stored, and one batch decoded, where `decode_top` holds the whole chunk decoded)."""
    import pyarrow as pa

    offset = footer.group_offsets[group] if group < len(footer.group_offsets) else None
    leaves = [leaf for leaf in footer.leaves if leaf.top == top]
    first = 0
    try:
        batches = parquet_file.reader.iter_batches(max(1, batch_rows), [group],
                                                   column_indices=[leaf.index for leaf in leaves], use_threads=False)
        for batch in batches:
            if batch.num_columns != 1 or batch.schema.names[0] != footer.top[top].name:
                raise FormatError(path, offset, f"row group {group}: column {footer.top[top].name!r} is not the footer's")
            if not batch.num_rows:
                continue
            col = batch.column(0)
            try:
                yield first, [leaf_data(leaf, col, path) for leaf in leaves]
            except FormatError as e:
                raise FormatError(path, offset, f"row group {group}: {e.message}") from None
            first += batch.num_rows
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(path, offset, f"row group {group} cannot be decoded: {e}") from None
    if first != footer.group_rows[group]:
        raise FormatError(path, offset, f"row group {group} decoded to {first} rows, its footer says "
                          f"{footer.group_rows[group]}")


def _empty(col: Any) -> Any:
    import pyarrow as pa

    return pa.array([], type=col.type)


class SourceGroups:
    """Decoded row groups of one source, the last ``keep`` kept: what `encode.encode_group`
    draws from.  ``source`` is a path or a file object pyarrow can read; one decode at a time (a
    ``ParquetFile`` is not shared between threads)."""

    def __init__(self, source: Any, footer: SourceFooter, path: str, keep: int = 2) -> None:
        self.source, self.footer, self.path, self.keep = source, footer, path, max(keep, 1)
        self._file: Any = None
        self._cache: OrderedDict[int, DecodedGroup] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, group: int) -> DecodedGroup:
        with self._lock:
            hit = self._cache.get(group)
            if hit is not None:
                self._cache.move_to_end(group)
                return hit
            if self._file is None:
                self._file = self._open()
            decoded = decode_group(self._file, self.footer, group, self.path)
            self._cache[group] = decoded
            while len(self._cache) > self.keep:
                self._cache.popitem(last=False)
            return decoded

    def _open(self) -> Any:
        """The source as a ``ParquetFile``, once its footer is checked to be the indexed one."""
        import pyarrow.parquet as pq

        if isinstance(self.source, (str, os.PathLike)):
            digest = footer_of_file(os.fspath(self.source)).digest
        else:
            f = self.source
            size = f.seek(0, os.SEEK_END)

            def read(a: int, b: int) -> bytes:
                f.seek(a)
                return f.read(b - a)

            digest = read_footer(size, read, self.path).digest
            f.seek(0)
        if digest != self.footer.digest:
            raise FormatError(self.path, None, "the file is not the version that was indexed (its footer changed)")
        try:
            return pq.ParquetFile(self.source)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for bad files
            raise FormatError(self.path, None, f"cannot be opened as Parquet: {e}") from None

    def close(self) -> None:
        with self._lock:
            self._cache.clear()
            if self._file is not None:
                self._file.close()
                self._file = None
