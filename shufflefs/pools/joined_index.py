"""One offset table over the data of several shard files, so a set of shards is shuffled as one.

The pool's records are its members' records in shard order: pooled record ids run through
member 0, then member 1, and so on, and pooled byte offsets through the concatenation of the
members' data regions (their headers and trailers left out).  Every strategy works on a
`PooledIndex` unchanged; only reading differs: a pooled offset belongs to one member file, at
``offset + shifts[m]``.  Units never cross files: each member is cut into units on its own grid
(a 4 MiB block is 4 MiB of one shard), and a member whose last line lacks its newline gains
one in the view, as a single file would.
"""

from __future__ import annotations

import numpy as np

from ..index.table import RecordIndex, SourceStamp, unit_firsts

I64 = np.int64


class PooledIndex(RecordIndex):
    """The records of ``members`` (their indexes, in shard order) as one index.

    Keeps the pooled bounds (8 bytes per record) and O(members) facts; the members' own bounds
    are not needed afterwards.
    """

    member_firsts: np.ndarray
    """First pooled record id of every member, then n (int64[members+1])."""
    shifts: np.ndarray
    """Member m's file offset of pooled offset x is ``x + shifts[m]`` (int64[members])."""
    member_frames: tuple[tuple[int, int, int], ...]
    """``(size, header_end, trailer_start)`` of every member file."""
    member_stamps: tuple[SourceStamp | None, ...]
    member_file: np.ndarray
    """The file of every member (int64[members]): member m is file m here; a mixture's members
    are segments of its files (`mix_index.MixIndex`)."""

    def __init__(self, members: list[RecordIndex] | tuple[RecordIndex, ...]) -> None:
        if not members:
            raise ValueError("a pool needs at least one member")
        data = np.array([m.trailer_start - m.header_end for m in members], I64)
        bases = np.concatenate((np.zeros(1, I64), np.cumsum(data)))
        counts = np.array([m.n for m in members], I64)
        firsts = np.concatenate((np.zeros(1, I64), np.cumsum(counts)))
        bounds = np.empty(int(firsts[-1]) + 1, I64)
        for m, idx in enumerate(members):  # a loop over files, each a vectorised copy
            np.subtract(idx.bounds[:-1], idx.header_end - bases[m], out=bounds[firsts[m]: firsts[m + 1]])
        bounds[-1] = bases[-1]
        super().__init__(int(bases[-1]), bounds, False, None)
        heads = np.array([m.header_end for m in members], I64)
        newline = np.array([m.add_newline for m in members], bool)
        put = object.__setattr__  # the dataclass is frozen
        put(self, "member_firsts", firsts)
        put(self, "shifts", heads - bases[:-1])
        put(self, "member_frames", tuple((m.size, m.header_end, m.trailer_start) for m in members))
        put(self, "member_stamps", tuple(m.stamp for m in members))
        put(self, "member_file", np.arange(len(members), dtype=I64))
        put(self, "_newline", firsts[1:][newline] - 1)

    @property
    def members(self) -> int:
        return len(self.shifts)

    @property
    def data_bytes(self) -> int:
        return self.trailer_start + len(self._newline)

    @property
    def newline_ids(self) -> np.ndarray:
        return self._newline

    def out_lengths(self, ids: np.ndarray) -> np.ndarray:
        out = self.record_lengths(ids)
        nl = self._newline
        if len(nl):
            pos = np.minimum(np.searchsorted(nl, ids), len(nl) - 1)
            out += nl[pos] == ids
        return out

    def unit_firsts(self, unit_size: int) -> np.ndarray:
        """Every member cut on its own grid of ``unit_size`` file bytes (a loop over members)."""
        b, f = self.bounds, self.member_firsts
        pieces = [np.zeros(1, I64)]
        for m in range(self.members):
            if f[m + 1] > f[m]:
                own = unit_firsts(b[f[m]: f[m + 1] + 1] + self.shifts[m], unit_size)
                pieces.append(own[1:] + f[m])
        return np.concatenate(pieces)

    def member_index(self, m: int) -> RecordIndex:
        """Member m's own index, rebuilt from the pooled bounds (O(its records))."""
        f = self.member_firsts
        size, _, _ = self.member_frames[m]
        bounds = self.bounds[f[m]: f[m + 1] + 1] + self.shifts[m]
        newline = f[m + 1] > f[m] and bool(np.isin(f[m + 1] - 1, self._newline))
        return RecordIndex(size, bounds, newline, self.member_stamps[m])

    def locate(self, offset: int) -> tuple[int, int]:
        """``(member, file offset)`` of a pooled byte offset (for error messages)."""
        m = int(np.searchsorted(self.bounds[self.member_firsts[1:-1]], offset, side="right"))
        return m, int(offset + self.shifts[m])

    def split_runs(self, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ascending runs of ids cut where members end: ``(first, count, member)`` (int64), so
        every run is one contiguous range of one file."""
        return split_runs(self.member_firsts, first, count)


def split_runs(member_firsts: np.ndarray, first: np.ndarray, count: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs ``[first, first+count)`` cut at the ``member_firsts`` boundaries (see `PooledIndex`)."""
    first = np.asarray(first, I64)
    end = first + np.asarray(count, I64)
    if len(first) == 0:
        return first, end - first, np.zeros(0, I64)
    lo = np.searchsorted(member_firsts, first, side="right") - 1
    hi = np.searchsorted(member_firsts, end - 1, side="right") - 1
    pieces = hi - lo + 1
    if int(pieces.max()) == 1:
        return first, end - first, lo.astype(I64)
    run = np.repeat(np.arange(len(first)), pieces)
    member = lo[run] + (np.arange(len(run)) - np.repeat(np.cumsum(pieces) - pieces, pieces))
    a = np.maximum(first[run], member_firsts[member])
    b = np.minimum(end[run], member_firsts[member + 1])
    keep = b > a  # members without records between two others
    return a[keep], (b - a)[keep], member[keep].astype(I64)
