"""Shared machinery of the strategies: units, rank shares, windows cut by bytes.

A *unit* is a run of consecutive records that a strategy moves as one piece: a block (CorgiPile,
Block-Only, No Shuffle), a page (LIRS page-aware) or a single record (the full permutations).
Unit-based plans keep O(units) state and expand a window to record ids only when it is asked for.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..index.table import RecordIndex
from .base import EVEN_MODES, LOCAL_MODES, Plan, ShuffleSpec

I64 = np.int64


def id_dtype(n: int) -> type:
    """Record ids of an index of ``n`` records: int32 while they fit, so that O(records) orders
    and the in-window shuffle move half the bytes of int64 (the same draws, hence the same order)."""
    return np.int32 if n < 2**31 - 1 else np.int64


def salt(label: str) -> int:
    """A stable integer naming one use of randomness, so no two uses share a stream."""
    return zlib.crc32(label.encode())


def check_params(spec: ShuffleSpec) -> None:
    """Reject parameters no strategy can honour (the strategy name is checked by `make_plan`)."""
    for name in ("block_size", "page_size", "block_floor"):
        v = getattr(spec, name)
        if v is None and name != "page_size":  # automatic: resolved per file
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must be a positive number of bytes, got {v!r}")
    b = spec.buffer
    if isinstance(b, bool):
        raise ValueError(f"buffer must be bytes (int) or a fraction (float), got {b!r}")
    if isinstance(b, (float, np.floating)):
        if not 0.0 < b <= 1.0:
            raise ValueError(f"a fractional buffer must be in (0, 1], got {b!r}")
    elif isinstance(b, (int, np.integer)):
        if b <= 0:
            raise ValueError(f"buffer must be a positive number of bytes, got {b!r}")
    else:
        raise ValueError(f"buffer must be bytes (int) or a fraction (float), got {b!r}")
    q = spec.exchange
    if isinstance(q, bool) or not isinstance(q, (int, float, np.integer, np.floating)) or not 0.0 <= float(q) <= 1.0:
        raise ValueError(f"exchange must be a fraction in [0, 1], got {q!r}")
    r = spec.random_level
    if isinstance(r, bool) or not isinstance(r, (int, float, np.integer, np.floating)) or not 0.0 <= float(r) <= 1.0:
        raise ValueError(f"random_level must be a fraction in [0, 1], got {r!r}")
    if spec.balance_field is not None and not spec.balance:
        raise ValueError("a balance field needs balance")
    if spec.balance_field is not None and not (isinstance(spec.balance_field, str) and spec.balance_field):
        raise ValueError(f"balance field must be a field name, got {spec.balance_field!r}")
    if spec.pls_local not in LOCAL_MODES:
        raise ValueError(f"pls local shuffle must be one of {', '.join(LOCAL_MODES)}, got {spec.pls_local!r}")
    if spec.even not in EVEN_MODES:
        raise ValueError(f"even must be none, pad or drop, got {spec.even!r}")
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, (int, np.integer)) or spec.seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {spec.seed!r}")


def share(count: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's piece ``[lo, hi)`` of ``count`` items, split like `np.array_split`."""
    q, r = divmod(count, world)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (rank < r)


def share_edges(count: int, world: int) -> np.ndarray:
    """Where every rank's `share` starts, then ``count`` (int64[world+1])."""
    r = np.arange(world + 1, dtype=I64)
    return r * (count // world) + np.minimum(r, count % world)


MIN_WINDOW = 1 << 20
"""The smallest window where windows are only the unit of I/O (the order does not depend on
them): a tiny buffer would otherwise make every record a window of its own, loaded alone."""


def part_buffer(buffer_bytes: int, parts: int) -> int:
    """A loader part's buffer: the rank's buffer split between its parts, so that the parts read
    at once (one per loader process) hold the rank's memory budget."""
    return max(1, buffer_bytes // parts)


def concat_ranges(lo: np.ndarray, hi: np.ndarray, dtype: type = I64) -> np.ndarray:
    """``concatenate([arange(a, b) for a, b in zip(lo, hi)])`` without the loop."""
    counts = hi - lo
    total = int(counts.sum())
    out = np.arange(total, dtype=dtype)
    if total:
        offsets = np.cumsum(counts) - counts
        out += np.repeat((lo - offsets).astype(dtype, copy=False), counts)
    return out


def permutation(gen: np.random.Generator, n: int) -> np.ndarray:
    """``gen.permutation(n)`` (the same draws, so the same order) as `id_dtype` record ids."""
    out = np.arange(n, dtype=id_dtype(n))
    gen.shuffle(out)
    return out


def cuts_by_count(m: int, per_window: int) -> np.ndarray:
    """Window boundaries taking ``per_window`` items at a time (int64[windows+1])."""
    return np.append(np.arange(0, m, per_window, dtype=I64), I64(m)) if m else np.zeros(1, I64)


def cuts_by_bytes(cum: np.ndarray, target: int) -> np.ndarray:
    """Window boundaries over items with running byte total ``cum`` (inclusive, int64).

    Window k takes the items whose last byte falls in view bytes ``[k*target, (k+1)*target)`` of
    the sequence, so a window is at most ``target`` plus one item; a window that would be empty
    (one item spanning several stretches) is dropped.
    """
    m = len(cum)
    if m == 0:
        return np.zeros(1, I64)
    stretches = (int(cum[-1]) - 1) // target
    if stretches <= m:
        inner = np.searchsorted(cum, np.arange(1, stretches + 1, dtype=I64) * target, side="right")
    else:
        w = cum - 1
        w //= target
        inner = np.flatnonzero(w[1:] != w[:-1]) + 1
    cuts = np.concatenate((np.zeros(1, I64), inner.astype(I64), np.full(1, m, I64)))
    keep = np.concatenate(([True], cuts[1:] != cuts[:-1]))
    return cuts[keep]


def order_cuts(index: RecordIndex, order: np.ndarray, target: int,
               chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """`cuts_by_bytes` over the view lengths of the records ``order``, and the windows' sizes.

    Works a chunk of records at a time, so the running byte total never costs 8 bytes per
    record of the order (the daemon's memory is budgeted per record).
    """
    m = len(order)
    inner: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    base, prev_w = 0, 0
    for lo in range(0, m, chunk):
        cum = index.out_lengths(order[lo: lo + chunk])
        np.cumsum(cum, out=cum)
        cum += base
        w = np.maximum(cum - 1, 0) // target
        change = np.flatnonzero(np.diff(w, prepend=prev_w))
        before = np.concatenate((np.full(1, base, I64), cum))[change]  # running total up to the cut
        keep = change + lo > 0
        inner.append(change[keep] + lo)
        ends.append(before[keep])
        base, prev_w = int(cum[-1]), int(w[-1])
    cuts = np.concatenate([np.zeros(1, I64), *inner, np.full(1, m, I64)]).astype(I64) if m else np.zeros(1, I64)
    ends_all = np.concatenate([*ends, np.full(1, base, I64)]).astype(I64) if m else np.zeros(0, I64)
    return cuts, np.diff(ends_all, prepend=I64(0)).astype(I64)


def frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class CutPlan(Plan):
    """A plan whose windows are consecutive stretches of one sequence, cut at ``cuts``."""

    buffer_bytes: int
    cuts: np.ndarray
    _sizes: np.ndarray
    rank_counts: np.ndarray
    """Records of every rank's share (all parts), int64[world]: what `even` equalises."""
    part_start: int
    """Where this part's records start in its rank's stream."""

    @property
    def window_sizes(self) -> np.ndarray:
        return self._sizes

    def _check_window(self, k: int) -> None:
        if not 0 <= k < self.n_windows:
            raise IndexError(f"window {k} outside 0..{self.n_windows - 1}")

    @property
    def window_records(self) -> np.ndarray:
        return np.diff(self.record_cuts)

    def describe(self) -> dict:
        return {**super().describe(), "buffer_bytes": self.buffer_bytes}


class UnitPlan(CutPlan):
    """Units permuted (or not), their records cut into equal shares for the ranks (and parts),
    and taken in consecutive groups as windows.

    The units in output order form one record stream; rank r takes stream positions
    ``share(n, r, W)``, so shares differ by at most one record (as DistributedSampler's do) and a
    unit may be split between two neighbouring shares.  State is O(units): the share's units,
    the record range each contributes (``lo``, ``hi``: whole units but perhaps the first and
    last), and each window's first position.  Subclasses choose the unit size, the unit order,
    the window grouping and what happens inside a window.
    """

    unit_label: str = "units"

    def __init__(self, index: RecordIndex, spec: ShuffleSpec, epoch: int, rank: int = 0, world: int = 1,
                 part: int = 0, parts: int = 1):
        super().__init__(index, spec, epoch, rank, world, part, parts)
        check_params(spec)
        self.buffer_bytes = part_buffer(spec.buffer_bytes(index.data_bytes), parts)
        self.firsts = frozen(index.unit_firsts(self.unit_size()))
        n_units = len(self.firsts) - 1
        order = self.unit_order(n_units)
        if order is None:
            order = np.arange(n_units, dtype=I64)
        # stream position of every unit in output order: O(units)
        per_unit = np.concatenate((np.zeros(1, I64), np.cumsum(np.diff(self.firsts)[order])))
        edges = share_edges(int(per_unit[-1]), world)
        self.rank_counts = frozen(np.diff(edges))
        plo, phi = share(int(self.rank_counts[rank]), part, parts)
        self.part_start = plo
        a, b = int(edges[rank]) + plo, int(edges[rank]) + phi
        k0 = int(np.searchsorted(per_unit, a, side="right")) - 1
        k1 = int(np.searchsorted(per_unit, b, side="left"))
        units = order[k0:k1] if b > a else order[:0]
        self.first_position = k0 if b > a else 0
        """Position of the share's first unit in the epoch's unit order (`unit_order`)."""
        lo, hi = self.firsts[units], self.firsts[units + 1]
        if len(units):  # the share may start and end inside a unit
            lo[0] += a - int(per_unit[k0])
            hi[-1] -= int(per_unit[k1]) - b
        self.units, self.lo, self.hi = frozen(units.copy()), frozen(lo), frozen(hi)
        sizes = index.unit_bytes(self.firsts)[units]  # exact for whole units, also from a summary
        for i in {0, len(units) - 1} if len(units) else ():
            if lo[i] != self.firsts[units[i]] or hi[i] != self.firsts[units[i] + 1]:
                sizes[i] = range_bytes(index, lo[i: i + 1], hi[i: i + 1])[0]
        cum = np.cumsum(sizes)
        self.cuts = frozen(self.window_cuts(cum))
        ends = cum[self.cuts[1:] - 1]
        self._sizes = frozen(np.diff(ends, prepend=I64(0)).astype(I64))
        records = np.concatenate((np.zeros(1, I64), np.cumsum(hi - lo)))
        self.record_cuts = frozen(records[self.cuts])

    def unit_size(self) -> int:
        return self.spec.block_size

    def unit_order(self, n_units: int) -> np.ndarray | None:
        """All units in output order, identical on every rank; None keeps source order."""
        return None

    def window_cuts(self, cum: np.ndarray) -> np.ndarray:
        """Consecutive units of about the buffer's bytes (at least `MIN_WINDOW`: unless a
        subclass shuffles inside windows, they only group reads)."""
        return cuts_by_bytes(cum, max(self.buffer_bytes, MIN_WINDOW))

    def arrange(self, k: int, ids: np.ndarray) -> np.ndarray:
        """Order of window k's records, given them unit by unit in source order inside units."""
        return ids

    def window(self, k: int) -> np.ndarray:
        self._check_window(k)
        w = slice(self.cuts[k], self.cuts[k + 1])
        return self.arrange(k, concat_ranges(self.lo[w], self.hi[w], id_dtype(self.index.n)))

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """From the window's record ranges (O(units)): sorted, adjacent ones merged."""
        self._check_window(k)
        w = slice(self.cuts[k], self.cuts[k + 1])
        at = np.argsort(self.lo[w], kind="stable")
        first, end = self.lo[w][at], self.hi[w][at]
        if len(first) == 0:
            return first, end - first
        starts = np.flatnonzero(np.concatenate(([True], first[1:] != end[:-1])))
        ends = np.append(starts[1:] - 1, len(first) - 1)
        return first[starts], end[ends] - first[starts]

    def describe(self) -> dict:
        return {**super().describe(), self.unit_label: len(self.firsts) - 1,
                f"{self.unit_label}_in_share": len(self.units)}


def range_bytes(index: RecordIndex, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """View bytes of the record ranges ``[lo, hi)`` (the newlines a view adds included)."""
    if len(lo) == 0:
        return np.zeros(0, I64)
    b = index.bounds
    out = np.asarray(b[hi], I64) - np.asarray(b[lo], I64)
    nl = index.newline_ids
    if len(nl):
        out += np.searchsorted(nl, hi, side="left") - np.searchsorted(nl, lo, side="left")
    return out


class OrderPlan(CutPlan):
    """A plan whose whole record order for the rank is computed up front (O(records) state).

    For strategies that are inherently record-level (full permutations, the sliding window).
    Windows are consecutive stretches of about the buffer's bytes.
    """

    def __init__(self, index: RecordIndex, spec: ShuffleSpec, epoch: int, rank: int = 0, world: int = 1,
                 part: int = 0, parts: int = 1):
        super().__init__(index, spec, epoch, rank, world, part, parts)
        check_params(spec)
        self.buffer_bytes = part_buffer(spec.buffer_bytes(index.data_bytes), parts)
        order = self.record_order()
        self.rank_counts = frozen(self.share_counts())
        lo, hi = share(len(order), part, parts)
        self.part_start = lo
        self.order = frozen(order if parts == 1 else order[lo:hi].copy())
        del order
        cuts, sizes = order_cuts(index, self.order, max(self.buffer_bytes, MIN_WINDOW))  # I/O units only
        self.cuts = self.record_cuts = frozen(cuts)
        self._sizes = frozen(sizes)

    def record_order(self) -> np.ndarray:
        """The rank's record ids in output order (`id_dtype`): its `share` of the n records."""
        raise NotImplementedError

    def share_counts(self) -> np.ndarray:
        """Records of every rank's share (int64[world])."""
        return np.diff(share_edges(self.index.n, self.world))

    def window(self, k: int) -> np.ndarray:
        """A read-only view into the plan's order."""
        self._check_window(k)
        return self.order[self.cuts[k]: self.cuts[k + 1]]

    def describe(self) -> dict:
        return {**super().describe(), "records_in_share": len(self.order)}
