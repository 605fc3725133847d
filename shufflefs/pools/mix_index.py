"""One epoch of a mixture as one offset table: the records the epoch takes from its sources
(repeats included), in the order of `strategies.mixture.epoch_segments`.

A `MixIndex` is a `PooledIndex` whose members are *segments*: runs of consecutive records of one
file, each at a shift of its own (``member_file`` names the file).  Every strategy then works on
it unchanged, and reading works as for a pool: a run of ids is cut where segments end, and each
piece is one contiguous range of one file.  A record an epoch takes twice is two segments over
the same bytes.  Units never cross segments, and inside one they follow the file's own grid, so
a block of a mixture is a block of one of its files.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..index.table import RecordIndex
from ..strategies.base import ShuffleSpec, effective_block_size
from ..strategies.mixture import epoch_segments, quotas
from .joined_index import PooledIndex, split_runs

I64 = np.int64


class MixIndex(PooledIndex):
    """Records ``[first[j], first[j]+count[j])`` of ``base`` (the pool of all the mixture's
    files, source after source) for every j, in that order: the epoch's stream before a strategy
    shuffles it.  ``takes``: records per source, for `stat`; ``source_starts``: the base record id
    where each source starts."""

    base: PooledIndex
    member_file: np.ndarray
    """The base member (file) of every segment (int64[segments])."""
    seg_base: np.ndarray
    """The base record id where every segment starts (int64[segments])."""
    takes: tuple[int, ...]
    source_starts: np.ndarray
    """The base record id where every source starts (int64[sources])."""
    repeated: np.ndarray | None
    """Which records of the epoch have a copy in it (bool[n]), or None if none has
    (`strategies.mixture.SpreadRepeats` keeps copies apart)."""

    def __init__(self, base: PooledIndex, first: np.ndarray, count: np.ndarray, takes: Sequence[int] = (),
                 source_starts: Sequence[int] = (0,)) -> None:
        first, count, member = split_runs(base.member_firsts, first, count)
        firsts = np.concatenate((np.zeros(1, I64), np.cumsum(count, dtype=I64)))
        n = int(firsts[-1])
        ids = np.repeat(first - firsts[:-1], count) + np.arange(n, dtype=I64)
        bounds = np.empty(n + 1, I64)
        bounds[0] = 0
        np.cumsum(base.bounds[ids + 1] - base.bounds[ids], out=bounds[1:])
        RecordIndex.__init__(self, int(bounds[-1]), bounds, False, None)
        put = object.__setattr__  # the dataclass is frozen
        put(self, "base", base)
        put(self, "member_firsts", firsts)
        put(self, "shifts", base.bounds[first] + base.shifts[member] - bounds[firsts[:-1]])
        put(self, "member_file", member.astype(I64))
        put(self, "seg_base", first.astype(I64))
        put(self, "member_frames", base.member_frames)  # per file, not per segment
        put(self, "member_stamps", base.member_stamps)
        put(self, "takes", tuple(int(t) for t in takes))
        put(self, "source_starts", np.asarray(source_starts, I64))
        counts = np.bincount(ids, minlength=base.n) if n else np.zeros(0, I64)
        put(self, "repeated", counts[ids] > 1 if n and counts.max() > 1 else None)
        del ids, counts
        last = first + count - 1  # a base record that gains a newline ends its member, so a segment
        gains = np.isin(last, base.newline_ids)
        put(self, "_newline", (firsts[1:] - 1)[gains].astype(I64))

    @property
    def files(self) -> int:
        return len(self.member_frames)

    def base_ids(self) -> np.ndarray:
        """The base record id of every record of the epoch (int64[n])."""
        f, c = self.member_firsts, np.diff(self.member_firsts)
        return np.repeat(self.seg_base - f[:-1], c) + np.arange(self.n, dtype=I64)

    def source_of(self, ids: np.ndarray) -> np.ndarray:
        """The source of records ``ids`` of the epoch (block orders keep the sources in
        proportion: `strategies.mixture.proportional_order`)."""
        return np.searchsorted(self.source_starts, self.base_ids_of(ids), side="right") - 1

    def base_ids_of(self, ids: np.ndarray) -> np.ndarray:
        """The base record ids of records ``ids`` of the epoch."""
        seg = np.searchsorted(self.member_firsts, ids, side="right") - 1
        return self.seg_base[seg] + (np.asarray(ids, I64) - self.member_firsts[seg])

    def unit_firsts(self, unit_size: int) -> np.ndarray:
        """Every segment cut on its file's grid of ``unit_size`` bytes: a record starts a unit
        when it starts a segment or its first byte lies in another grid cell than the one before."""
        n = self.n
        if n == 0:
            return np.zeros(1, I64)
        f = self.member_firsts
        seg = np.repeat(np.arange(len(f) - 1, dtype=I64), np.diff(f))
        cell = (self.bounds[:-1] + self.shifts[seg]) // unit_size
        new = np.ones(n, bool)
        new[1:] = (cell[1:] != cell[:-1]) | (seg[1:] != seg[:-1])
        return np.concatenate((np.flatnonzero(new).astype(I64), np.full(1, n, I64)))

    def member_index(self, m: int) -> RecordIndex:
        raise NotImplementedError("a mixture's segments are no files; use base.member_index")

    def locate(self, offset: int) -> tuple[int, int]:
        """``(file, file offset)`` of an offset in the epoch's stream (for error messages)."""
        j = int(np.searchsorted(self.bounds[self.member_firsts[1:-1]], offset, side="right"))
        return int(self.member_file[j]), int(offset + self.shifts[j])


RECORD_ORDERS = ("full", "once")
"""Strategies that order single records: a mixture samples their records one by one.  The
others read blocks, and an epoch takes a source's records by its files' blocks (the grid a plan
cuts them on), so that a block of the mixture is a block of one file: the records an epoch
takes are then whole blocks chosen at random, rather than single records."""
GROUPED_ORDERS = ("stratified",)
"""Strategies that deal every stretch of their stream to every buffer: the epoch's stream holds
its sources one after another, so every buffer gets each source's share to within a block (so
does a record order's, in which the stream's order does not matter: `epoch_segments`)."""


def epoch_index(base: PooledIndex, firsts: Sequence[int], weights: Sequence[float], samples: int | None,
                spec: ShuffleSpec, epoch: int) -> MixIndex:
    """Epoch ``epoch`` of the mixture over ``base`` (the pool of its files; source s's are
    members ``[firsts[s], firsts[s+1])``): `quotas` of ``samples`` records (None: as many as the
    sources hold) by ``weights``, each source's taken by `epoch_segments`.  A pure function of
    its arguments: every rank and node computes the same."""
    starts = base.member_firsts[np.asarray(firsts, I64)]
    counts = np.diff(starts)
    takes = quotas(int(counts.sum()) if samples is None else samples, weights)
    empty = np.flatnonzero((counts == 0) & (takes > 0))
    if len(empty):
        raise ValueError(f"source #{int(empty[0]) + 1} has no records but is asked for {int(takes[empty[0]])}")
    if spec.strategy in RECORD_ORDERS:
        runs: list = [1] * len(counts)
    else:
        blocks = base.unit_firsts(effective_block_size(spec, base.data_bytes))
        runs = [np.concatenate((blocks[(blocks >= a) & (blocks < b)], [b])) - a if b > a else 1
                for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
    grouped = spec.strategy in GROUPED_ORDERS or spec.strategy in RECORD_ORDERS
    src, first, count = epoch_segments(spec.seed, epoch, counts, takes, runs, grouped)
    return MixIndex(base, first + starts[src], count, takes, starts[:-1])


def describe_epoch(index: MixIndex, firsts: Sequence[int], globs: Sequence[str], weights: Sequence[float],
                   epoch: int) -> list[dict]:
    """What each source gave an epoch (for ``shufflefs stat``): its records, the records taken,
    and which passes over it the epoch's slice lies in (0: the first)."""
    counts = np.diff(index.base.member_firsts[np.asarray(firsts, I64)])
    out = []
    for glob, weight, n, take in zip(globs, weights, counts.tolist(), index.takes):
        lo, hi = epoch * take, (epoch + 1) * take
        passes = [lo // n, (hi - 1) // n] if take and n else []
        out.append({"glob": glob, "weight": weight, "records": n, "taken": take, "passes": passes})
    return out
