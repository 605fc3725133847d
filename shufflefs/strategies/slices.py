"""A stretch of another plan's stream: what output shard i of a pool shows.

A pool's shards split the (rank's) pooled stream by position, not by source: output shard i holds
records ``[edges[i], edges[i+1])`` of the stream, so the shards read in name order are exactly the
stream, and any one shard holds a random sample of the pool (a stretch of a shuffled order).
The windows are the stream's windows clipped to the stretch, so the windows a pooled view loads
are the ones the whole stream would load, and the shards share no record.
"""

from __future__ import annotations

import numpy as np

from .base import Plan
from .units import I64, share_edges


def slice_edges(records: int, shards: int) -> np.ndarray:
    """Where every shard's stretch of a stream of ``records`` starts, then ``records``: equal
    counts, the first ``records % shards`` shards one more (int64[shards+1])."""
    return share_edges(records, shards)


class SlicePlan(Plan):
    """Records ``[lo, hi)`` of ``inner``'s stream (its windows in order), in the same order."""

    def __init__(self, inner: Plan, lo: int, hi: int, shard: int = 0, shards: int = 1) -> None:
        super().__init__(inner.index, inner.spec, inner.epoch, inner.rank, inner.world, inner.part, inner.parts)
        records = np.asarray(inner.window_records, I64)
        ends = np.cumsum(records)
        total = int(ends[-1]) if len(ends) else 0
        if not 0 <= lo <= hi <= total:
            raise ValueError(f"stretch [{lo}, {hi}) outside a stream of {total} records")
        self.inner, self.lo, self.hi, self.shard, self.shards = inner, lo, hi, shard, shards
        self.name = inner.name  # type: ignore[misc]
        starts = ends - records
        # inner windows overlapping [lo, hi), and how much of each is kept
        k0 = int(np.searchsorted(ends, lo, side="right"))
        k1 = int(np.searchsorted(starts, hi, side="left")) if hi > lo else k0
        self._k0 = k0
        self._cut_lo = np.maximum(lo - starts[k0:k1], 0)
        self._cut_hi = np.minimum(hi - starts[k0:k1], records[k0:k1])
        sizes = np.array(inner.window_sizes[k0:k1], I64)
        self._clipped = np.flatnonzero((self._cut_lo > 0) | (self._cut_hi < records[k0:k1]))
        self._shifts = np.zeros(len(sizes), I64)
        for j in self._clipped.tolist():
            ids = inner.window(k0 + j)
            lo_, hi_ = int(self._cut_lo[j]), int(self._cut_hi[j])
            sizes[j] = int(self.index.out_lengths(ids[lo_:hi_]).sum())
            self._shifts[j] = int(self.index.out_lengths(ids[:lo_]).sum())
        self._sizes = sizes
        self._records = (self._cut_hi - self._cut_lo).astype(I64)

    @property
    def window_sizes(self) -> np.ndarray:
        return self._sizes

    @property
    def window_records(self) -> np.ndarray:
        return self._records

    def window(self, k: int) -> np.ndarray:
        if not 0 <= k < self.n_windows:
            raise IndexError(f"window {k} outside 0..{self.n_windows - 1}")
        ids = self.inner.window(self._k0 + k)
        return ids[int(self._cut_lo[k]): int(self._cut_hi[k])]

    def stream_window(self, k: int) -> tuple[int, int]:
        """``(inner window, byte offset)``: window k's bytes are those of the inner window from
        that offset on (the inner window loaded once serves every stretch that cuts it)."""
        return self._k0 + k, int(self._shifts[k])

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        if k in self._clipped:
            return None
        return self.inner.window_runs(self._k0 + k)

    def describe(self) -> dict:
        return {**self.inner.describe(), "windows": self.n_windows, "shard": self.shard, "shards": self.shards,
                "stream_records": int(np.asarray(self.inner.window_records).sum()), "shard_first": self.lo}
