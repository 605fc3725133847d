"""A dataset described by its blocks alone: enough for the block plans, at any record count.

The block plans (`none`, `block`, `corgipile`, and `pls` through its exchange) see an index only
through ``n``, ``data_bytes``, ``unit_firsts(block_size)`` and ``unit_bytes``: per-block record
counts and bytes.  A `BlockSummary` holds exactly those, O(blocks), so the plans of a billion-record
dataset can be built and measured without its 8-byte-per-record offset table, and without the data.

Record-level questions (the lengths that `pls` and the record-level strategies cut their windows
by) are answered from a layout the summary fixes: inside a block the records split its bytes evenly
(the first ``bytes % records`` records one byte longer).  Block-level answers are exact; record
lengths are exact only for a dataset laid out that way (`synthetic` builds such layouts, and
`to_index` turns one into the equal `RecordIndex`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..index.table import RecordIndex
from .base import MiB, rng
from .units import I64, frozen, salt

RECORDS = salt("summary/records")
OFFSETS = salt("summary/offsets")


def _int64_vector(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1 or not (a.dtype.kind in "iu"):
        raise ValueError(f"{name} must be a 1-d integer array")
    return frozen(a.astype(I64, copy=True))


class RecordBounds:
    """``bounds[i]`` of a `BlockSummary`'s layout, computed for the ids asked (O(len(ids))).

    Stands where code indexes a record index's bounds with record ids; slicing it would build
    the O(records) table, so it is refused."""

    dtype = np.dtype(I64)
    ndim = 1

    def __init__(self, summary: "BlockSummary"):
        self._s = summary

    def __len__(self) -> int:
        return self._s.n + 1

    def __getitem__(self, ids):
        if isinstance(ids, slice):
            raise TypeError("a block summary's bounds are computed per record id: index them with ids, not a slice")
        scalar = np.ndim(ids) == 0
        out = self._s.record_starts(np.atleast_1d(np.asarray(ids, dtype=I64)))
        return out[0] if scalar else out


@dataclass(frozen=True, eq=False)
class BlockSummary:
    """Records and bytes of every non-empty block of ``block_size`` source bytes, in source order.

    Usable as the ``index`` of `make_plan` for the strategies whose units are blocks of this size.
    Block k holds records ``[firsts[k], firsts[k+1])``: ``block_records[k]`` (>= 1) records of
    ``block_bytes[k]`` source bytes.  ``newlines``: record ids that gain a newline in the view
    (sorted; a text file whose last line lacks one), counted in `unit_bytes` like the index does.
    """

    block_size: int
    block_records: np.ndarray
    block_bytes: np.ndarray
    header_end: int = 0
    newlines: np.ndarray = field(default_factory=lambda: np.zeros(0, I64))
    firsts: np.ndarray = field(init=False, repr=False)
    """First record id of every block, then n (int64[blocks+1]); read-only, returned as is."""
    offsets: np.ndarray = field(init=False, repr=False)
    """Source offset of every block's first record, then the trailer's (int64[blocks+1])."""
    _step: int = field(init=False, repr=False)
    _lut: np.ndarray | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, (int, np.integer)) or self.block_size <= 0:
            raise ValueError(f"block_size must be a positive number of bytes, got {self.block_size!r}")
        recs = _int64_vector(self.block_records, "block_records")
        nbytes = _int64_vector(self.block_bytes, "block_bytes")
        if len(recs) != len(nbytes):
            raise ValueError(f"{len(recs)} record counts for {len(nbytes)} block sizes")
        if len(recs) and (recs.min() < 1 or nbytes.min() < 0):
            raise ValueError("every block holds at least one record and no negative bytes")
        if self.header_end < 0:
            raise ValueError("header_end must be >= 0")
        firsts = np.zeros(len(recs) + 1, I64)
        np.cumsum(recs, out=firsts[1:])
        offsets = np.full(len(recs) + 1, int(self.header_end), I64)
        offsets[1:] += np.cumsum(nbytes)
        nl = _int64_vector(self.newlines, "newlines")
        if len(nl) and (nl[0] < 0 or nl[-1] >= firsts[-1] or (np.diff(nl) <= 0).any()):
            raise ValueError("newlines must be sorted distinct record ids")
        # ids in a run of `step` (the fewest records of any block but the last) meet at most two
        # blocks, so lut[id // step] and one comparison find an id's block in O(1) instead of a
        # binary search; kept while it costs O(blocks)
        step = int(recs[:-1].min()) if len(recs) > 1 else max(int(firsts[-1]), 1)
        lut = None
        if len(recs) and firsts[-1] // step <= 4 * len(recs):
            lut = np.searchsorted(firsts, np.arange(0, firsts[-1] + 1, step, dtype=I64), side="right") - 1
            lut = frozen(np.minimum(lut, len(recs) - 1).astype(np.int32 if len(recs) < 2**31 else I64))
        for name, value in (("block_records", recs), ("block_bytes", nbytes), ("newlines", nl),
                            ("firsts", frozen(firsts)), ("offsets", frozen(offsets)), ("_step", step), ("_lut", lut)):
            object.__setattr__(self, name, value)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def of(cls, index: RecordIndex, block_size: int) -> "BlockSummary":
        """The summary of a record index's blocks (reads its bounds once: O(records))."""
        firsts = index.unit_firsts(block_size)
        b = index.bounds
        return cls(block_size, np.diff(firsts), b[firsts[1:]] - b[firsts[:-1]], index.header_end,
                   np.asarray(index.newline_ids, dtype=I64))

    @classmethod
    def synthetic(cls, n: int, block_size: int = 4 * MiB, record_bytes: int = 1024, spread: float = 0.25,
                  seed: int = 0, blocks: int | None = None) -> "BlockSummary":
        """A seeded dataset of ``n`` records in ``blocks`` consecutive blocks (default: enough for
        records of about ``record_bytes``), O(blocks) to build.

        Records per block vary by up to ``spread`` around the mean; each block's records start
        inside it and the last one ends past it by a random amount, so `to_index` is a valid layout
        whose blocks are exactly these (needs at most ``block_size // 2`` records per block)."""
        if n < 0 or not 0.0 <= spread < 1.0:
            raise ValueError("need n >= 0 and a spread in [0, 1)")
        if n == 0:
            return cls(block_size, np.zeros(0, I64), np.zeros(0, I64))
        if blocks is None:
            blocks = max(1, -(-n * record_bytes // block_size))
        if not 1 <= blocks <= n:
            raise ValueError(f"{n} records cannot fill {blocks} non-empty blocks")
        w = 1.0 + spread * rng(seed, RECORDS).uniform(-1.0, 1.0, blocks)
        cum = np.floor(np.cumsum(w) * (n / w.sum())).astype(I64)
        cum[-1] = n
        recs = np.diff(cum, prepend=I64(0))
        if recs.min() < 1 or recs.max() > block_size // 2:
            raise ValueError(f"{n} records in {blocks} blocks of {block_size} bytes: some block would hold "
                             f"{int(recs.min())} or {int(recs.max())} records (1 .. {block_size // 2} fit)")
        # e[k]: where block k's first record starts past the block's start; below half a block and
        # below the shortest record of block k-1 (which therefore still starts inside block k-1)
        room = block_size // 2 // recs[:-1]
        e = np.zeros(blocks, I64)
        e[1:] = np.floor(rng(seed, OFFSETS).random(blocks - 1) * room).astype(I64)
        nbytes = np.append(block_size + e[1:] - e[:-1], block_size - e[-1])
        return cls(block_size, recs, nbytes)

    def to_index(self) -> RecordIndex:
        """The record index of this layout (O(records): for small summaries). Raises ValueError
        if the layout's own blocks differ from the summary's (a summary `of` an index whose records
        are not evenly split inside blocks)."""
        index = RecordIndex(self.trailer_start, self.bounds[np.arange(self.n + 1, dtype=I64)],
                            add_newline=bool(len(self.newlines)))
        if len(self.newlines) and not np.array_equal(index.newline_ids, self.newlines):
            raise ValueError("a record index adds a newline to its last record only")
        if not np.array_equal(index.unit_firsts(self.block_size), self.firsts):
            raise ValueError("records split evenly inside these blocks would move to other blocks")
        return index

    # -- what the plans ask ---------------------------------------------------------------

    @property
    def n(self) -> int:
        return int(self.firsts[-1])

    @property
    def blocks(self) -> int:
        return len(self.block_records)

    @property
    def trailer_start(self) -> int:
        return int(self.offsets[-1])

    @property
    def data_bytes(self) -> int:
        """Bytes of records in the view (with the added newlines)."""
        return self.trailer_start - int(self.header_end) + len(self.newlines)

    @property
    def add_newline(self) -> bool:
        return bool(len(self.newlines))

    @property
    def newline_ids(self) -> np.ndarray:
        return self.newlines

    @property
    def nbytes(self) -> int:
        """Memory the summary holds (its arrays)."""
        arrays = (self.block_records, self.block_bytes, self.newlines, self.firsts, self.offsets, self._lut)
        return sum(a.nbytes for a in arrays if a is not None)

    def unit_firsts(self, unit_size: int) -> np.ndarray:
        """The block firsts (O(1): the summary's own read-only array); other unit sizes need the
        record index and raise ValueError."""
        if unit_size != self.block_size:
            raise ValueError(f"a block summary knows blocks of {self.block_size} bytes only, not units of "
                             f"{unit_size} bytes: plan with block_size={self.block_size} or from the record index")
        return self.firsts

    def unit_bytes(self, firsts: np.ndarray) -> np.ndarray:
        """View bytes of each unit ``[firsts[u], firsts[u+1])``: exact when the firsts are block firsts."""
        firsts = np.asarray(firsts, dtype=I64)
        if firsts is self.firsts or np.array_equal(firsts, self.firsts):
            out = self.block_bytes.copy()
        else:
            out = np.diff(self.record_starts(firsts))
        if len(self.newlines) and len(out):
            out += np.diff(np.searchsorted(self.newlines, firsts, side="left"))
        return out

    # -- the record layout, per id --------------------------------------------------------

    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Block of every id (the last block for id n) and the id's place in it."""
        if self._lut is None:
            k = np.searchsorted(self.firsts, ids, side="right") - 1
        else:
            k = self._lut[ids // self._step].astype(I64)
            k += ids >= self.firsts[k + 1]
        np.minimum(k, self.blocks - 1, out=k)
        return k, ids - self.firsts[k]

    def record_starts(self, ids: np.ndarray) -> np.ndarray:
        """``bounds[ids]`` of the layout (ids in [0, n]; id n gives the trailer's start)."""
        ids = np.asarray(ids, dtype=I64)
        if ids.size and (ids.min() < 0 or ids.max() > self.n):
            raise IndexError(f"record ids outside 0..{self.n}")
        if self.blocks == 0:
            return np.full(ids.shape, int(self.header_end), I64)
        k, j = self._locate(ids)
        q, r = np.divmod(self.block_bytes[k], self.block_records[k])
        return self.offsets[k] + j * q + np.minimum(j, r)

    @property
    def bounds(self) -> RecordBounds:
        return RecordBounds(self)

    def record_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Source length of records ``ids`` in the layout (int64): O(len(ids) * log(blocks))."""
        ids = np.asarray(ids, dtype=I64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n):
            raise IndexError(f"record ids outside 0..{self.n - 1}")
        k, j = self._locate(ids)
        q, r = np.divmod(self.block_bytes[k], self.block_records[k])
        return q + (j < r)

    def out_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Length in the view of records ``ids`` (a record in `newline_ids` gains a newline)."""
        out = self.record_lengths(ids)
        if len(self.newlines):
            ids = np.asarray(ids, dtype=I64)
            pos = np.minimum(np.searchsorted(self.newlines, ids), len(self.newlines) - 1)
            out += self.newlines[pos] == ids
        return out
