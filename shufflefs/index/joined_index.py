"""One offset table over the data of several shard files, so a set of shards is shuffled as one.

The pool's records are its members' records in shard order: pooled record ids run through
member 0, then member 1, and so on, and pooled byte offsets through the concatenation of the
members' data regions (their headers and trailers left out).  Every strategy works on a
`PooledIndex` unchanged; only reading differs: a pooled offset belongs to one member file, at
``offset + shifts[m]``.  Units never cross files: each member is cut into units on its own grid
(a 4 MiB block is 4 MiB of one shard).

A member whose last line lacks its newline ends in a torn record, which views keep last, as a
single file's: the pool's views are planned over `PooledIndex.torn_last`, a `SegmentIndex` of the
members' records with the torn ones moved to the end (in shard order, a newline added between
them).  A `SegmentIndex` holds records of a pool as *segments*: runs of consecutive records of one
file, each at a shift of its own; mixtures' epochs are segment indexes too (`mix_index`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from .table import RecordIndex, SourceStamp, unit_firsts

I64 = np.int64
LOOPED_SEGMENTS = 4096
"""Up to this many segments, an index is cut into units segment by segment (O(units) each)."""


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
        torn = np.array([m.add_newline for m in members], bool)
        put = object.__setattr__  # the dataclass is frozen
        put(self, "member_firsts", firsts)
        put(self, "shifts", heads - bases[:-1])
        put(self, "member_frames", tuple((m.size, m.header_end, m.trailer_start) for m in members))
        put(self, "member_stamps", tuple(m.stamp for m in members))
        put(self, "member_file", np.arange(len(members), dtype=I64))
        put(self, "_torn", firsts[1:][torn] - 1)
        put(self, "block_floor", max(m.block_floor for m in members))  # compressed members: their restart spacing

    @property
    def members(self) -> int:
        return len(self.shifts)

    @property
    def torn(self) -> int:
        return 0  # a member's torn record ends the member, not the pool: see `torn_last`

    @property
    def unterminated_ids(self) -> np.ndarray:
        """The last record of every member whose last line lacks its newline."""
        return self._torn

    def body(self) -> "PooledIndex":
        return self

    @functools.cached_property
    def _torn_last(self) -> "PooledIndex":
        if not len(self._torn):
            return self
        return SegmentIndex(self, self.member_firsts[:-1], np.diff(self.member_firsts))

    def torn_last(self) -> "PooledIndex":
        """The pool's records with its members' torn records moved to the end (a `SegmentIndex`,
        made once; itself if none is torn): the index its views are planned and read over."""
        return self._torn_last

    def unit_firsts(self, unit_size: int) -> np.ndarray:
        """Every member cut on its own grid of ``unit_size`` file bytes (a loop over members)."""
        b, f = self.bounds, self.member_firsts
        pieces = [np.zeros(1, I64)]
        for m in range(self.members):
            if f[m + 1] > f[m]:
                own = unit_firsts(b[f[m]: f[m + 1] + 1] + self.shifts[m], unit_size)
                pieces.append(own[1:] + f[m])
        return np.concatenate(pieces)

    def member_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Per member, in its file's offsets: where the record before its first starts (-1: its
        first is its file's first) and where its file's records end (its trailer), for the check
        of tar samples against their neighbours in their files (`windows.edges`)."""
        return self._member_edges

    @functools.cached_property
    def _member_edges(self) -> tuple[np.ndarray, np.ndarray]:
        ends = np.array([frame[2] for frame in self.member_frames], I64)
        return np.full(self.members, -1, I64), ends[self.member_file]

    def member_index(self, m: int) -> RecordIndex:
        """Member m's own index, rebuilt from the pooled bounds (O(its records))."""
        f = self.member_firsts
        size, _, _ = self.member_frames[m]
        bounds = self.bounds[f[m]: f[m + 1] + 1] + self.shifts[m]
        torn = f[m + 1] > f[m] and bool(np.isin(f[m + 1] - 1, self._torn))
        return RecordIndex(size, bounds, torn, self.member_stamps[m])

    def locate(self, offset: int) -> tuple[int, int]:
        """``(member, file offset)`` of a pooled byte offset (for error messages)."""
        m = int(np.searchsorted(self.bounds[self.member_firsts[1:-1]], offset, side="right"))
        return m, int(offset + self.shifts[m])

    def split_runs(self, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ascending runs of ids cut where members end: ``(first, count, member)`` (int64), so
        every run is one contiguous range of one file."""
        return split_runs(self.member_firsts, first, count)


def joined(members: list[RecordIndex], names: Sequence[str] = ()) -> PooledIndex:
    """The pool of ``members`` with its `PooledIndex.torn_last` made (O(records), so a worker
    thread's work, not the first view's); ``names``, the members' paths, as `joined_parquet` takes."""
    index = PooledIndex(members)
    index.torn_last()
    return index


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


class SegmentIndex(PooledIndex):
    """Records ``[first[j], first[j]+count[j])`` of ``base`` (a pool of files) for every j, in
    that order, then every torn record they hold (a line without its newline, which ends its
    file), each as a segment of its own, in base order: the ``torn`` last ids, given last.

    Reading works as for a pool: a run of ids is cut where segments end, and each piece is one
    contiguous range of one file (``member_file``) at the segment's shift.  Units never cross
    segments.  Every torn record but the last gains a newline in the view, so they stay lines."""

    base: PooledIndex
    seg_base: np.ndarray
    """The base record id where every segment starts (int64[segments])."""

    def __init__(self, base: PooledIndex, first: np.ndarray, count: np.ndarray) -> None:
        first, count = np.asarray(first, I64), np.asarray(count, I64)
        some = count > 0  # an empty member is no segment
        first, count, member = split_runs(base.member_firsts, first[some], count[some])
        torn_ids = base.unterminated_ids
        torn = 0
        if len(torn_ids) and len(first):
            # a torn record ends its member, so it ends the segment holding it: split it off
            last = first + count - 1
            cut = np.isin(last, torn_ids)
            torn = int(np.count_nonzero(cut))
            if torn:
                at = np.argsort(last[cut], kind="stable")
                count = count - cut
                keep = count > 0
                first = np.concatenate((first[keep], last[cut][at]))
                member = np.concatenate((member[keep], member[cut][at]))
                count = np.concatenate((count[keep], np.ones(torn, I64)))
        firsts = np.concatenate((np.zeros(1, I64), np.cumsum(count, dtype=I64)))
        n = int(firsts[-1])
        bounds = np.empty(n + 1, I64)
        bounds[0] = 0
        if n:
            ids = np.repeat(first - firsts[:-1], count) + np.arange(n, dtype=I64)
            np.cumsum(base.bounds[ids + 1] - base.bounds[ids], out=bounds[1:])
            del ids
        RecordIndex.__init__(self, int(bounds[-1]), bounds, False, None)
        put = object.__setattr__  # the dataclass is frozen
        put(self, "base", base)
        put(self, "member_firsts", firsts)
        put(self, "shifts", base.bounds[first] + base.shifts[member] - bounds[firsts[:-1]])
        put(self, "member_file", base.member_file[member].astype(I64))
        put(self, "seg_base", first.astype(I64))
        put(self, "member_frames", base.member_frames)  # per file, not per segment
        put(self, "member_stamps", base.member_stamps)
        put(self, "_torn", np.arange(n - torn, n, dtype=I64))
        put(self, "block_floor", base.block_floor)

    @property
    def files(self) -> int:
        return len(self.member_frames)

    @property
    def torn(self) -> int:
        return len(self._torn)

    @property
    def newline_ids(self) -> np.ndarray:
        return self._torn[:-1]

    def body(self) -> "SegmentIndex":
        """The segments before the torn ones: the same ids and arrays, cut (O(segments))."""
        if not self.torn:
            return self
        keep = len(self.seg_base) - self.torn
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.__dict__.pop("_torn_last", None)
        out.__dict__.pop("_member_edges", None)
        put = object.__setattr__
        put(out, "bounds", self.bounds[: self.n - self.torn + 1])
        put(out, "size", int(out.bounds[-1]))
        put(out, "_lengths", [])
        for name in ("member_firsts",):
            put(out, name, getattr(self, name)[: keep + 1])
        for name in ("shifts", "member_file", "seg_base"):
            put(out, name, getattr(self, name)[:keep])
        put(out, "_torn", np.zeros(0, I64))
        return out

    def torn_last(self) -> "SegmentIndex":
        return self

    def base_ids(self) -> np.ndarray:
        """The base record id of every record (int64[n])."""
        f, c = self.member_firsts, np.diff(self.member_firsts)
        return np.repeat(self.seg_base - f[:-1], c) + np.arange(self.n, dtype=I64)

    def base_ids_of(self, ids: np.ndarray) -> np.ndarray:
        """The base record ids of records ``ids``."""
        seg = np.searchsorted(self.member_firsts, ids, side="right") - 1
        return self.seg_base[seg] + (np.asarray(ids, I64) - self.member_firsts[seg])

    def unit_firsts(self, unit_size: int) -> np.ndarray:
        """Every segment cut on its file's grid of ``unit_size`` bytes: a record starts a unit
        when it starts a segment or its first byte lies in another grid cell than the one before
        (few segments, as a pool's: each cut as a member, `PooledIndex.unit_firsts`)."""
        n = self.n
        if n == 0:
            return np.zeros(1, I64)
        f = self.member_firsts
        if len(f) <= LOOPED_SEGMENTS:
            return PooledIndex.unit_firsts(self, unit_size)
        seg = np.repeat(np.arange(len(f) - 1, dtype=I64), np.diff(f))
        cell = (self.bounds[:-1] + self.shifts[seg]) // unit_size
        new = np.ones(n, bool)
        new[1:] = (cell[1:] != cell[:-1]) | (seg[1:] != seg[:-1])
        return np.concatenate((np.flatnonzero(new).astype(I64), np.full(1, n, I64)))

    @functools.cached_property
    def _member_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """A segment's first record follows the record before it in its file (`base`), whether
        or not the segment before it is of that file."""
        base, seg, file = self.base, self.seg_base, self.member_file
        ends = np.array([frame[2] for frame in self.member_frames], I64)[file]
        inside = seg > base.member_firsts[file]
        return np.where(inside, base.bounds[np.maximum(seg - 1, 0)] + base.shifts[file], -1).astype(I64), ends

    def member_index(self, m: int) -> RecordIndex:
        raise NotImplementedError("segments are no files; use base.member_index")

    def locate(self, offset: int) -> tuple[int, int]:
        """``(file, file offset)`` of an offset in the index (for error messages)."""
        j = int(np.searchsorted(self.bounds[self.member_firsts[1:-1]], offset, side="right"))
        return int(self.member_file[j]), int(offset + self.shifts[j])
