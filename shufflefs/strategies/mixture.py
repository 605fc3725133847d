"""Which records of each source a mixture's epoch takes, and in which proportions they follow
one another.  Pure numpy: a function of (seed, epoch, the mix table), the same on every node.

A mixture blends sources (each a set of files of one format) by weight into ``samples`` records
per epoch:

* **Counts.** Source i gives `quotas` ``round(samples * w_i / sum(w))`` records, by largest
  remainders, so the counts add up to ``samples`` exactly and each is within one of its share.
* **No repeats before exhaustion.** Each source's records form an endless stream of passes, each
  pass a fresh permutation of all its records (`pass_order`), and epoch e takes positions
  ``[e * take, (e + 1) * take)`` of that stream (`epoch_records`).  A source asked for fewer
  records than it has gives the next slice each epoch, every record once before any repeats; one
  asked for more repeats whole passes plus a slice of the next.  A permutation is of runs of
  consecutive records (a file's blocks, or single records), which keeps a slice to a few long
  reads of a large source: its runs, not its records, are what an epoch chooses.
* **In the source's own order.** Each pass's records enter the blend sorted (`in_file_order`):
  a strategy then sees a source as it is, and copies from two passes stay a pass apart.
* **Interleaved.** `epoch_segments` places the sources' pieces so that every stretch of the
  epoch holds each source's share, as `interleave` places records (or source after source, for
  the strategies that deal stretches out themselves), before a strategy shuffles.
* **In proportion in every buffer.** Block orders permute a mixture's blocks within each source
  and interleave the sources by records (`proportional_order`), and `SpreadRepeats` keeps a
  record's copies apart.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np

from .base import Plan, rng

MIX_SALT = 0x6D1C
"""Keeps a mixture's draws apart from every strategy's (`base.rng` keys)."""


def quotas(samples: int, weights: Sequence[float]) -> np.ndarray:
    """Records each source gives an epoch: proportional to ``weights``, summing to ``samples``
    exactly, each within one of ``samples * w / sum(w)`` (largest remainders; ties to the first).
    Exact for any sizes: the weights' binary fractions are added as integers (a handful of sources,
    so a loop over them)."""
    w = np.asarray(weights, np.float64)
    if samples < 0 or len(w) == 0 or np.any(~np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
        raise ValueError(f"a mixture needs samples >= 0 and weights >= 0 with a positive sum: {samples}, {list(w)}")
    exact = [Fraction(float(x)) for x in w]
    total = sum(exact)
    shares = [samples * x / total for x in exact]
    base = [math.floor(x) for x in shares]
    short = samples - sum(base)
    order = sorted(range(len(w)), key=lambda i: (-(shares[i] - base[i]), i))
    for i in order[:short]:
        base[i] += 1
    return np.array(base, np.int64)


def pass_order(seed: int, source: int, passes: int, n: int, run: int | np.ndarray = 1,
               lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Positions ``[lo, hi)`` of pass ``passes`` of source ``source`` (``n`` records): its record
    ids in a random order of runs of consecutive records: ``run`` records each (the last run may
    be shorter), or the runs an array of first ids (then ``n``) cuts, such as a file's blocks.
    Only the runs the slice touches are expanded, so a slice of a huge source stays small."""
    hi = n if hi is None else min(hi, n)
    if n == 0 or hi <= lo:
        return np.zeros(0, np.int64)
    if isinstance(run, np.ndarray):
        cuts = run.astype(np.int64)
        if len(cuts) < 2 or cuts[0] != 0 or cuts[-1] != n or np.any(np.diff(cuts) <= 0):
            raise ValueError(f"runs must cut 0..{n} into non-empty pieces")
        perm = rng(seed, MIX_SALT, source, passes).permutation(len(cuts) - 1)
        starts, lengths = cuts[perm], np.diff(cuts)[perm]
    else:
        runs = -(-n // run)
        starts = rng(seed, MIX_SALT, source, passes).permutation(runs).astype(np.int64) * run
        lengths = np.minimum(starts + run, n) - starts
    first = np.cumsum(lengths) - lengths  # where each run begins in the pass
    a = int(np.searchsorted(first, lo, side="right")) - 1
    b = int(np.searchsorted(first, hi, side="left"))
    starts, lengths, first = starts[a:b], lengths[a:b], first[a:b]
    ids = np.repeat(starts - first, lengths) + np.arange(int(first[0]), int(first[-1] + lengths[-1]), dtype=np.int64)
    return ids[lo - int(first[0]): hi - int(first[0])]


def epoch_records(seed: int, epoch: int, source: int, n: int, take: int, run: int | np.ndarray = 1) -> np.ndarray:
    """The ``take`` record ids (of ``n``) source ``source`` gives epoch ``epoch``, in stream order:
    positions ``[epoch * take, (epoch + 1) * take)`` of its endless stream of passes."""
    if take == 0:
        return np.zeros(0, np.int64)
    if n == 0:
        raise ValueError(f"source {source} has no records but is asked for {take}")
    lo, hi = epoch * take, (epoch + 1) * take
    return np.concatenate([pass_order(seed, source, p, n, run, max(lo - p * n, 0), min(hi - p * n, n))
                           for p in range(lo // n, (hi - 1) // n + 1)])


def interleave(takes: Sequence[int]) -> np.ndarray:
    """Source of each position of an epoch of ``sum(takes)`` records: source i's k-th record at
    ``(k + phase_i) / takes[i]`` of the way through (phases spread over (0, 1) by source), so
    any stretch of m positions holds ``m * takes[i] / sum(takes)`` of each, give or take about a
    record per source (each of the others may have one more than its share in the stretch)."""
    takes = np.asarray(takes, np.int64)
    src = np.repeat(np.arange(len(takes)), takes)
    k = np.arange(len(src)) - np.repeat(np.cumsum(takes) - takes, takes)
    # each source's own phase, so that sources of equal counts do not all fall on the same spots
    phase = (np.arange(len(takes)) + 0.5) / max(len(takes), 1)
    due = (k + phase[src]) / np.repeat(np.maximum(takes, 1), takes)
    return src[np.argsort(due, kind="stable")]


def in_file_order(ids: np.ndarray, lo: int, n: int) -> np.ndarray:
    """A source's slice of its stream (positions ``lo`` on, ``n`` records a pass) with each
    pass's records sorted: which records an epoch takes is the permutation's, the order they
    enter the blend in is the source's own, so that a strategy sees the source as it is (sorted
    data stays sorted for `stratified` to deal out) and copies from two passes stay a pass apart."""
    starts = np.arange(-(-lo // n) * n, lo + len(ids), n) - lo  # where each later pass begins
    starts = starts[(starts > 0) & (starts < len(ids))]
    return np.concatenate([np.sort(part) for part in np.split(ids, starts)])


def epoch_segments(seed: int, epoch: int, counts: Sequence[int], takes: Sequence[int],
                   runs: Sequence[int | np.ndarray], grouped: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An epoch's records as ``(source, first, count)`` (int64 each): runs of consecutive
    records of one source (ids local to the source), in the order the epoch's stream holds them.

    Source s gives `epoch_records` (``takes[s]`` of its ``counts[s]`` records, permuted in runs
    ``runs[s]``), each pass's in file order (`in_file_order`); its records are cut where ids stop
    following one another and where runs start.  The pieces of all
    sources are interleaved by where they fall in their source's take, as `interleave` places
    records (a piece of source s that starts at its k-th record and holds c records goes at
    ``(k + phase_s * c) / takes[s]``), so every stretch of the stream holds each source's share,
    give or take a piece per source.  ``grouped``: source after source instead, in pieces as long
    as the ids run, for a strategy that deals every stretch of the stream to every buffer
    (`stratified`, which then gives each buffer each source's share to within a block) or that
    orders single records at random (where the stream's order does not matter, and long pieces
    keep the offset table small).  A strategy then shuffles the stream."""
    sources, firsts, lengths, due = [], [], [], []
    phases = (np.arange(len(takes)) + 0.5) / max(len(takes), 1)
    for s, (n, take, run) in enumerate(zip(counts, takes, runs)):
        ids = epoch_records(seed, epoch, s, int(n), int(take), run if isinstance(run, np.ndarray) else max(1, int(run)))
        if len(ids) == 0:
            continue
        ids = in_file_order(ids, epoch * int(take), int(n))
        # pieces: where ids stop following one another; interleaved, also at every run's start
        # (sorted runs that touch would otherwise enter the interleave as one long piece)
        breaks = np.diff(ids) != 1
        if not grouped:
            breaks |= np.isin(ids[1:], run) if isinstance(run, np.ndarray) else ids[1:] % max(1, int(run)) == 0
        cut = np.flatnonzero(breaks) + 1
        starts = np.concatenate((np.zeros(1, np.int64), cut))
        count = np.diff(np.concatenate((starts, [len(ids)]))).astype(np.int64)
        sources.append(np.full(len(starts), s, np.int64))
        firsts.append(ids[starts])
        lengths.append(count)
        due.append(s + (starts + phases[s] * count) / int(take) if grouped else (starts + phases[s] * count) / int(take))
    if not sources:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(np.concatenate(due), kind="stable")
    return np.concatenate(sources)[order], np.concatenate(firsts)[order], np.concatenate(lengths)[order]


def proportional_order(group: np.ndarray, records: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """A random order of units (``group[u]``: its source, ``records[u]``: its records) in which
    every stretch holds each group's share of the records: each group's units in a random order,
    the groups' sequences interleaved by records as `interleave` places records.  Within a group
    it is a uniform permutation; across groups, proportion replaces the draw of a uniform
    permutation of all units (whose buffers hold a source's share give or take the square root
    of its blocks)."""
    group = np.asarray(group, np.int64)
    records = np.asarray(records, np.int64)
    if len(group) == 0:
        return np.zeros(0, np.int64)
    perm = gen.permutation(len(group))
    perm = perm[np.argsort(group[perm], kind="stable")]  # each group's units, in random order
    g, r = group[perm], records[perm]
    groups = int(g.max()) + 1
    totals = np.bincount(g, weights=r, minlength=groups)
    starts = np.searchsorted(g, np.arange(groups))
    before = np.cumsum(r) - r - (np.cumsum(np.concatenate(([0], r)))[starts])[g]
    phase = (np.arange(groups) + 0.5) / groups
    due = (before + phase[g] * r) / np.maximum(totals[g], 1)
    return perm[np.argsort(due, kind="stable")].astype(np.int64)


def block_order(index: object, firsts: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """The units cut at ``firsts`` in a random order: a uniform permutation, or for a mixture's
    epoch (an index that knows each record's ``source_of``) its `proportional_order`."""
    source_of = getattr(index, "source_of", None)
    if source_of is None:
        return gen.permutation(len(firsts) - 1).astype(np.int64, copy=False)
    return proportional_order(source_of(firsts[:-1]), np.diff(firsts), gen)


class SpreadRepeats(Plan):
    """``inner``'s windows with no record next to a copy of itself: an epoch that takes a record
    twice (an up-sampled source, or a down-sampled one whose slice crosses the end of a pass)
    must not serve both copies back to back, which readers that group a sample's members by key
    (WebDataset) would take for one sample with every member twice.

    The index says which of its records have copies (``repeated``) and what each one is a copy
    of (``base_ids_of``).  A window's first and last records are swapped for records without
    copies, so no two windows' edges meet in a pair, and each record next to its own copy is
    swapped with one that fits, nearest half a window away (deterministic, so every rank agrees).
    Only the order inside windows changes: sizes, runs and the records of every window stay.
    Best effort: a window too full of copies (a source asked for many passes of a few records)
    may keep a pair."""

    def __init__(self, inner: Plan) -> None:
        super().__init__(inner.index, inner.spec, inner.epoch, inner.rank, inner.world, inner.part, inner.parts)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]

    @property
    def window_sizes(self) -> np.ndarray:
        return self.inner.window_sizes

    @property
    def window_records(self) -> np.ndarray:
        return self.inner.window_records

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        return self.inner.window_runs(k)

    def describe(self) -> dict:
        return self.inner.describe()

    def window(self, k: int) -> np.ndarray:
        ids = np.array(self.inner.window(k))
        n = len(ids)
        repeated = self.index.repeated[ids]
        if n < 3 or not repeated.any():
            return ids
        key = self.index.base_ids_of(ids)
        bad = np.flatnonzero(key[1:] == key[:-1]) + 1
        ends = [i for i in (0, n - 1) if repeated[i]]
        for i in [*ends, *bad.tolist()]:
            if i not in ends and key[i] != key[i - 1]:
                continue  # mended by an earlier swap
            j = self._partner(key, repeated, i, edge=i in (0, n - 1))
            if j is not None:
                ids[[i, j]], key[[i, j]], repeated[[i, j]] = ids[[j, i]], key[[j, i]], repeated[[j, i]]
        return ids

    @staticmethod
    def _partner(key: np.ndarray, repeated: np.ndarray, i: int, edge: bool) -> int | None:
        """A position to swap with ``i``: away from the window's edges, holding a record without
        copies if ``i`` is an edge, and leaving neither place next to its own copy."""
        n = len(key)
        for step in range(n):
            j = (i + n // 2 + step) % n
            if j in (0, n - 1) or abs(j - i) <= 1 or (edge and repeated[j]):
                continue
            a, b = key[i], key[j]
            if key[j - 1] != a and key[j + 1] != a and (i == 0 or key[i - 1] != b) and (i == n - 1 or key[i + 1] != b):
                return j
        return None
