"""Partial local shuffling as a strategy ("Why Globally Re-shuffle?", §III).

Every rank holds a partition of the file: at epoch 0 its share of the blocks, permuted once from
the seed (so the partition is read in whole blocks, and stays the same while Q = 0).  Before each
later epoch a fraction Q of every rank's records moves to other ranks with balanced counts
(`exchange.Exchange`: computed by every rank from the seed, no communication), then the rank
shuffles its partition uniformly.  Q = 0 is pure local shuffling, Q = 1 moves every record.
"""

from __future__ import annotations

import functools

import numpy as np

from .base import rng
from .exchange import Exchange
from .units import OrderPlan, salt, unit_firsts

UNITS = salt("pls/units")
LOCAL = salt("pls/local")


class PartialLocalPlan(OrderPlan):
    """The rank's partition for the epoch, shuffled locally (a fresh uniform permutation)."""

    name = "pls"

    @functools.cached_property
    def exchange(self) -> Exchange:
        """The exchange of this file's blocks between the ranks (O(blocks + ranks) state)."""
        firsts = unit_firsts(self.index.bounds, self.spec.block_size)
        order = rng(self.spec.seed, UNITS).permutation(len(firsts) - 1).astype(np.int64, copy=False)
        return Exchange(firsts, order, self.world, float(self.spec.exchange), self.spec.seed)

    def record_order(self) -> np.ndarray:
        part = self.exchange.partition(self.rank, self.epoch)
        rng(self.spec.seed, self.epoch, LOCAL, self.rank).shuffle(part)
        return part

    def share_counts(self) -> np.ndarray:
        return self.exchange.sizes

    def describe(self) -> dict:
        c = self.exchange.counts(self.rank, self.epoch)
        return {**super().describe(), "exchange": float(self.spec.exchange), "block_size": self.spec.block_size,
                "partition_records": c["records"], "kept": c["kept"], "received": c["received"], "sent": c["sent"]}
