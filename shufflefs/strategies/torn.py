"""Torn records last: a line without its newline never moves into the middle of a view.

A text file being appended to ends in a half-written line; a file saved without a final newline
ends in a whole one.  Neither can be told from the other, and a reader that meets a half-written
line inside a view (a JSON-lines loop) fails there.  So an index's torn records (its last
``torn`` ids, `index.table.RecordIndex.torn`: one for a file, one per such member for a pool or a
mixture's epoch) are never shuffled: every strategy plans the other records (``index.body()``),
and the torn ones follow, in id order, at the very end of the epoch's stream: the last part of
the last rank (for a pool, then its last shard).  Every record is still given exactly once; a
file's view has the file's bytes and size, its torn line last and unchanged; several torn records
get a newline between them (`RecordIndex.newline_ids`), none after the last.

The cost: a torn record is always last, not shuffled, and the last rank's last part holds the
torn records on top of its share (a file's one record keeps shares within one record of each
other, as the body's shares give the first ranks the extra records).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..index.table import RecordIndex
from .base import Plan
from .units import I64, id_dtype


def holds_torn(rank: int, world: int, part: int, parts: int) -> bool:
    """Whether this stream ends the epoch's streams, and so holds the torn records."""
    return rank == world - 1 and part == parts - 1


class TornLast(Plan):
    """``inner`` (a plan of ``index.body()``) and, in the epoch's last stream, one more window:
    the index's torn records in id order."""

    def __init__(self, inner: Plan, index: RecordIndex) -> None:
        super().__init__(index, inner.spec, inner.epoch, inner.rank, inner.world, inner.part, inner.parts)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        torn = index.torn
        if inner.index.n != index.n - torn:
            raise ValueError(f"the inner plan holds {inner.index.n} records, not the {index.n - torn} of the body")
        self.torn = torn
        here = holds_torn(self.rank, self.world, self.part, self.parts) and torn > 0
        self.tail = np.arange(index.n - torn, index.n, dtype=id_dtype(index.n)) if here else None
        sizes = np.asarray(inner.window_sizes, I64)
        if self.tail is not None:
            sizes = np.append(sizes, I64(index.out_lengths(self.tail).sum()))
        self._sizes = sizes
        self.held_last = int(self.tail is not None)
        """Windows at the end that must stay last (`even.EvenPlan` pads before them)."""

    @property
    def window_sizes(self) -> np.ndarray:
        return self._sizes

    @property
    def window_records(self) -> np.ndarray:
        records = np.asarray(self.inner.window_records, I64)
        return records if self.tail is None else np.append(records, I64(len(self.tail)))

    @property
    def rank_counts(self) -> np.ndarray:
        """Records of every rank's stream: the inner plan's, the last rank's with the torn ones."""
        counts = np.array(self.inner.rank_counts, I64)  # type: ignore[attr-defined]
        counts[-1] += self.torn
        return counts

    @property
    def part_start(self) -> int:
        return int(self.inner.part_start)  # type: ignore[attr-defined]

    def window(self, k: int) -> np.ndarray:
        if self.tail is not None and k == self.inner.n_windows:
            return self.tail
        return self.inner.window(k)

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        if self.tail is not None and k == self.inner.n_windows:
            return np.array([int(self.tail[0])], I64), np.array([len(self.tail)], I64)
        return self.inner.window_runs(k)

    def describe(self) -> dict:
        return {**self.inner.describe(), "records": self.index.n, "windows": self.n_windows, "torn": self.torn,
                "torn_here": 0 if self.tail is None else len(self.tail)}


def stream_length(share: int, torn: int, rank: int, world: int, part: int, parts: int) -> int:
    """Records of a stream whose body share is ``share``: with the torn ones if it ends the epoch."""
    return share + (torn if holds_torn(rank, world, part, parts) else 0)


class WithTorn:
    """A rank's partitions by epoch (`exchange.Partitions` of the body) with the index's torn
    records added for the last rank: its last part reads them, so its stage must hold them (a
    source without descriptors, a bucket, can serve a staged view from its stage alone)."""

    def __init__(self, partitions: Callable[[int], np.ndarray], index: RecordIndex, rank: int, world: int) -> None:
        self.partitions = partitions
        self.tail = np.arange(index.n - index.torn, index.n, dtype=np.int64) \
            if index.torn and rank == world - 1 else None

    def __call__(self, epoch: int) -> np.ndarray:
        ids = self.partitions(epoch)
        return ids if self.tail is None else np.concatenate((ids, self.tail.astype(ids.dtype, copy=False)))
