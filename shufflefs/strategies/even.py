"""Equal record counts on every rank, as PyTorch's DistributedSampler offers, on top of any plan.

Distributed training needs the same number of steps on every rank, while exact shares of a
shuffled dataset can differ (by a record for record-level strategies, by a block's records for
block-level ones).  ``even="pad"`` repeats records on the short ranks up to the longest share;
``even="drop"`` leaves the tail of the long ranks' streams out down to the shortest share (a
random set of records, since the streams are shuffled; a different one every epoch).  Only the
last windows of a rank's stream change: padding is one extra window at the end of the rank's last
part, dropping cuts the stream at the target count, in whichever part that falls.
"""

from __future__ import annotations

import numpy as np

from .base import EVEN_MODES, Plan
from .units import I64, CutPlan, id_dtype


class EvenPlan(Plan):
    """``inner`` with its rank's stream padded or cut to the same record count on every rank."""

    def __init__(self, inner: CutPlan) -> None:
        super().__init__(inner.index, inner.spec, inner.epoch, inner.rank, inner.world, inner.part, inner.parts)
        mode = inner.spec.even
        if mode not in EVEN_MODES:
            raise ValueError(f"even must be one of {', '.join(EVEN_MODES)}, got {mode!r}")
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        counts = inner.rank_counts
        self.target = int(counts.max() if mode == "pad" else counts.min()) if mode != "none" else int(counts[inner.rank])
        records = inner.window_records
        here = int(records.sum())
        start = inner.part_start
        keep = min(here, max(0, self.target - start)) if mode == "drop" else here
        self.dropped = here - keep
        last_part = inner.part == inner.parts - 1
        self.padded = max(0, self.target - int(counts[inner.rank])) if mode == "pad" and last_part else 0
        # windows kept whole, then perhaps a cut one, then perhaps the padding (before the
        # windows the inner plan holds last: torn records, `torn.TornLast`)
        ends = np.cumsum(records)
        whole = int(np.searchsorted(ends, keep, side="right"))
        self._cut = keep - (int(ends[whole - 1]) if whole else 0)  # records of window ``whole`` kept
        self._extra: list[np.ndarray] = []
        if self._cut:
            self._extra.append(inner.window(whole)[: self._cut].copy())
        held = getattr(inner, "held_last", 0) if self.padded else 0
        whole -= held  # padding never drops, so the held windows are whole ones
        self._whole = whole
        if self.padded:
            self._extra += self._padding(self.padded, inner.n_windows - held)
        self._extra += [inner.window(k) for k in range(whole, whole + held)]
        sizes = [np.asarray(inner.window_sizes[:whole], I64)]
        sizes += [np.array([int(inner.index.out_lengths(ids).sum())], I64) for ids in self._extra]
        self._sizes = np.concatenate(sizes)

    def _padding(self, count: int, windows: int) -> list[np.ndarray]:
        """The first records of this part (of its first ``windows``) again, as windows of
        distinct records (a window never holds a record twice); the source's first records if the
        part has none (a rank that got no block at all)."""
        inner, n = self.inner, self.inner.index.n
        dtype = id_dtype(n)
        own = [inner.window(k) for k in range(min(windows, count))]
        pool = np.concatenate(own)[:count] if own else np.empty(0, dtype)
        if len(pool) == 0:
            pool = np.arange(min(max(n - getattr(inner.index, "torn", 0), 1), count), dtype=dtype)
        if len(pool) == 0:
            raise ValueError("cannot pad a rank of a file without records")
        ids = np.resize(pool, count).astype(dtype, copy=False)
        return [ids[i: i + len(pool)] for i in range(0, count, len(pool))]

    @property
    def window_sizes(self) -> np.ndarray:
        return self._sizes

    @property
    def window_records(self) -> np.ndarray:
        return np.concatenate((self.inner.window_records[: self._whole], [len(e) for e in self._extra])).astype(I64)

    def window(self, k: int) -> np.ndarray:
        if k < self._whole:
            return self.inner.window(k)
        if not 0 <= k < self.n_windows:
            raise IndexError(f"window {k} outside 0..{self.n_windows - 1}")
        return self._extra[k - self._whole]

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        return self.inner.window_runs(k) if k < self._whole else None

    def describe(self) -> dict:
        return {**self.inner.describe(), "windows": self.n_windows, "even": self.spec.even,
                "rank_records": self.target, "padded": self.padded, "dropped": self.dropped}
