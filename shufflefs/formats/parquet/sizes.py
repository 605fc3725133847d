"""The index of a Parquet source: per row and leaf column, how many bytes its values take in a
view (PLAIN) and, for repeated leaves, how many level entries it has.

These numbers are all a view's layout needs (`layout`): with PLAIN values, no compression and
bit-packed levels, the size of every page follows from sums of them, so a view's footer and
offsets are known at open in milliseconds, before any byte is encoded.  They are computed by
decoding the source one row group at a time (memory: one row group), and stored compactly: a
column whose rows all take the same bytes (a fixed-width column without nulls) keeps one number;
others keep the smallest unsigned dtype that holds their largest row.  Bytes per row of the index:
the sum, over leaf columns, of 0 (constant), 1, 2, 4 or 8 for the values, plus as much again for
the level entries of each repeated leaf (e.g. 5 for id, label, text of up to 1000 characters,
score, a list<int32> and a dictionary string: text 2, list 1 + 1, string 1).  The source row
group of a row is found from ``group_starts`` (8 bytes per row group, none per row).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from ...errors import FormatError
from .decode import DecodedGroup, SourceGroups
from .footer import BOOLEAN, SourceFooter, footer_of_file


def compact(a: np.ndarray) -> np.ndarray | int:
    """``a`` (non-negative ints) as one int if all equal, else in the smallest unsigned dtype."""
    if len(a) == 0:
        return 0
    lo, hi = int(a.min()), int(a.max())
    if lo == hi:
        return lo
    for dt in (np.uint8, np.uint16, np.uint32):
        if hi <= np.iinfo(dt).max:
            return a.astype(dt)
    return a.astype(np.uint64)


@dataclass(frozen=True)
class ColumnSizes:
    """One leaf column: ``values`` each row's PLAIN value bytes (BOOLEAN: its number of values,
    bit-packed per page), ``entries`` each row's level entries (None: one per row).  Either may
    be one int for every row."""

    values: np.ndarray | int
    entries: np.ndarray | int | None

    def values_of(self, rows: np.ndarray) -> np.ndarray | int:
        return self.values if isinstance(self.values, int) else self.values[rows]

    def entries_of(self, rows: np.ndarray) -> np.ndarray | int:
        if self.entries is None:
            return 1
        return self.entries if isinstance(self.entries, int) else self.entries[rows]

    def totals(self, n: int) -> tuple[int, int]:
        """The value bytes and level entries of the column's ``n`` rows: every layout of every
        epoch (and every shard of a pool) asks, so the arrays are summed once."""
        values = self.values * n if isinstance(self.values, int) else self._value_sum
        if self.entries is None:
            return values, n
        return values, self.entries * n if isinstance(self.entries, int) else self._entry_sum

    @cached_property
    def _value_sum(self) -> int:
        return int(np.asarray(self.values).sum(dtype=np.int64))

    @cached_property
    def _entry_sum(self) -> int:
        return int(np.asarray(self.entries).sum(dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.values, self.entries) if isinstance(x, np.ndarray))


@dataclass(frozen=True)
class RowSizes:
    """The index of one source: ``group_starts`` (int64, groups + 1) the first row of each source
    row group, ``columns`` one `ColumnSizes` per leaf, ``digest`` the footer's (`SourceFooter`)."""

    n_rows: int
    group_starts: np.ndarray
    columns: tuple[ColumnSizes, ...]
    booleans: tuple[bool, ...]
    digest: str

    def group_of(self, rows: np.ndarray) -> np.ndarray:
        """The source row group of each row id (int64)."""
        return np.searchsorted(self.group_starts, np.asarray(rows, np.int64), side="right") - 1

    def record_lengths(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Each row's PLAIN value bytes over all columns (a boolean counting 1 byte, levels not
        counted; at least 1): the record length byte-based strategies (block sizes) weigh."""
        n = self.n_rows if rows is None else len(rows)
        sel = np.arange(self.n_rows) if rows is None else np.asarray(rows, np.int64)
        out = np.zeros(n, np.int64)
        for col in self.columns:
            out += col.values if isinstance(col.values, int) else col.values[sel]
        return np.maximum(out, 1)

    @property
    def nbytes(self) -> int:
        return self.group_starts.nbytes + sum(c.nbytes for c in self.columns)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The index as named arrays (for ``np.savez``); `from_arrays` reads them back."""
        out = {"group_starts": self.group_starts, "digest": np.frombuffer(self.digest.encode(), np.uint8),
               "booleans": np.array(self.booleans, bool)}
        for i, c in enumerate(self.columns):
            for name, v in (("values", c.values), ("entries", c.entries)):
                if v is not None:
                    out[f"{name}{i}"] = v if isinstance(v, np.ndarray) else np.array([v], np.int64)
                    out[f"{name}{i}_const"] = np.array(isinstance(v, int))
        return out

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "RowSizes":
        gs = np.asarray(a["group_starts"], np.int64)
        booleans = tuple(bool(x) for x in a["booleans"])
        cols = []
        for i in range(len(booleans)):
            got = []
            for name in ("values", "entries"):
                if f"{name}{i}" not in a:
                    got.append(None)
                elif bool(a[f"{name}{i}_const"]):
                    got.append(int(a[f"{name}{i}"][0]))
                else:
                    got.append(np.asarray(a[f"{name}{i}"]))
            cols.append(ColumnSizes(got[0] if got[0] is not None else 0, got[1]))
        return cls(int(gs[-1]), gs, tuple(cols), booleans, bytes(a["digest"]).decode())


def build_sizes(footer: SourceFooter, decode: Callable[[int], DecodedGroup], path: str = "") -> RowSizes:
    """The index of a source with ``footer``, from its row groups decoded one after the other."""
    per_col: list[list[np.ndarray | int]] = [[] for _ in footer.leaves]
    per_ent: list[list[np.ndarray | int]] = [[] for _ in footer.leaves]
    for g in range(len(footer.group_rows)):
        dec = decode(g)
        if dec.digest != footer.digest or dec.rows != footer.group_rows[g]:
            raise FormatError(path, footer.group_offsets[g], f"row group {g} is not the footer's")
        for leaf, data in zip(footer.leaves, dec.leaves):
            per_col[leaf.index].append(compact(data.value_bytes(leaf)))
            if leaf.max_rep:
                per_ent[leaf.index].append(compact(data.entries()))
        del dec
    starts = np.zeros(len(footer.group_rows) + 1, np.int64)
    np.cumsum(footer.group_rows, out=starts[1:])
    cols = []
    for leaf in footer.leaves:
        values = _join(per_col[leaf.index], footer.group_rows)
        entries = _join(per_ent[leaf.index], footer.group_rows) if leaf.max_rep else None
        cols.append(ColumnSizes(values, entries))
    return RowSizes(int(starts[-1]), starts, tuple(cols), tuple(l.physical == BOOLEAN for l in footer.leaves),
                    footer.digest)


def _join(parts: Sequence[np.ndarray | int], rows: Sequence[int]) -> np.ndarray | int:
    """Per-group compact arrays as one compact array (or one int when every row agrees)."""
    if all(isinstance(p, int) for p in parts) and len({int(p) for p in parts}) <= 1:  # type: ignore[arg-type]
        return int(parts[0]) if parts else 0  # type: ignore[arg-type]
    hi = max(int(p) if isinstance(p, int) else int(p.max(initial=0)) for p in parts)
    dt = compact(np.array([0, hi])).dtype  # type: ignore[union-attr]
    out = np.empty(sum(rows), dt)
    pos = 0
    for p, n in zip(parts, rows):
        out[pos : pos + n] = p
        pos += n
    return out


def sizes_of_file(path: str, keep: int = 1) -> tuple[SourceFooter, RowSizes]:
    """Footer and index of a local Parquet file (decoded one row group at a time)."""
    footer = footer_of_file(path)
    groups = SourceGroups(path, footer, path, keep=keep)
    try:
        return footer, build_sizes(footer, groups, path)
    finally:
        groups.close()
