"""One epoch of a mixture as one offset table: the records the epoch takes from its sources
(repeats included), in the order of `strategies.mixture.epoch_segments`.

A `MixIndex` is an `index.joined_index.SegmentIndex`: its members are *segments*, runs of consecutive
records of one file, each at a shift of its own (``member_file`` names the file).  Every
strategy then works on it unchanged, and reading works as for a pool: a run of ids is cut where
segments end, and each piece is one contiguous range of one file.  A record an epoch takes twice
is two segments over the same bytes; a torn record it takes (a file's last line without its
newline) is given at the end of the epoch's stream, as in a pool.  Units never cross segments, and inside one they follow the file's own grid, so
a block of a mixture is a block of one of its files.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..strategies.base import ShuffleSpec, effective_block_size, floored
from ..strategies.mixture import epoch_segments, quotas
from ..index.joined_index import PooledIndex, SegmentIndex

I64 = np.int64


class MixIndex(SegmentIndex):
    """Records ``[first[j], first[j]+count[j])`` of ``base`` (the pool of all the mixture's
    files, source after source) for every j, in that order, then the torn records they take
    (`SegmentIndex`): the epoch's stream before a strategy shuffles it.  ``takes``: records per
    source, for `stat`; ``source_starts``: the base record id where each source starts."""

    takes: tuple[int, ...]
    source_starts: np.ndarray
    """The base record id where every source starts (int64[sources])."""
    repeated: np.ndarray | None
    """Which records of the epoch have a copy in it (bool[n]), or None if none has
    (`strategies.mixture.SpreadRepeats` keeps copies apart)."""

    def __init__(self, base: PooledIndex, first: np.ndarray, count: np.ndarray, takes: Sequence[int] = (),
                 source_starts: Sequence[int] = (0,)) -> None:
        super().__init__(base, first, count)
        put = object.__setattr__  # the dataclass is frozen
        put(self, "takes", tuple(int(t) for t in takes))
        put(self, "source_starts", np.asarray(source_starts, I64))
        n = self.n
        ids = self.base_ids() if n else np.zeros(0, I64)
        counts = np.bincount(ids, minlength=base.n) if n else np.zeros(0, I64)
        put(self, "repeated", counts[ids] > 1 if n and counts.max() > 1 else None)

    def body(self) -> "MixIndex":
        out = super().body()
        if out is not self and self.repeated is not None:
            object.__setattr__(out, "repeated", self.repeated[: out.n])
        return out

    def source_of(self, ids: np.ndarray) -> np.ndarray:
        """The source of records ``ids`` of the epoch (block orders keep the sources in
        proportion: `strategies.mixture.proportional_order`)."""
        return np.searchsorted(self.source_starts, self.base_ids_of(ids), side="right") - 1


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
        blocks = base.unit_firsts(effective_block_size(floored(spec, base), base.data_bytes))
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
