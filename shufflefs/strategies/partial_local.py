"""Partial local shuffling as a strategy ("Why Globally Re-shuffle?", §III).

Every rank holds a partition of the file: at epoch 0 its share of the blocks, permuted once from
the seed (so the partition is read in whole blocks, and stays the same while Q = 0).  Before each
later epoch a fraction Q of every rank's records moves to other ranks with balanced counts
(`exchange.Exchange`: computed by every rank from the seed, no communication), then the rank
shuffles its partition: uniformly, or with ``spec.pls_local = "corgipile"`` the CorgiPile way (the
partition's records grouped by source block, the groups permuted, records shuffled inside
buffer-sized windows), which reads the partition in block runs instead of record by record.
Q = 0 is pure local shuffling, Q = 1 moves every record.
"""

from __future__ import annotations

import functools

import numpy as np

from ..index.table import RecordIndex
from .base import ShuffleSpec, resolve_spec, rng
from .exchange import Exchange
from .mixture import block_order
from .units import OrderPlan, cuts_by_bytes, salt

UNITS = salt("pls/units")
LOCAL = salt("pls/local")
LOCAL_BLOCKS = salt("pls/local-blocks")


def corgipile_order(part: np.ndarray, bounds: np.ndarray, block_firsts: np.ndarray, buffer_bytes: int,
                    gen: np.random.Generator) -> np.ndarray:
    """CorgiPile over a set of records: ``part``'s records grouped by the source block holding
    them (block k owns ids ``[block_firsts[k], block_firsts[k+1])``), the groups in a random order,
    then the records shuffled inside consecutive windows of about ``buffer_bytes``."""
    ids = np.sort(part)
    block = np.searchsorted(block_firsts, ids, side="right") - 1
    present = np.unique(block)
    rank = np.empty(len(block_firsts), np.int64)
    rank[present] = gen.permutation(len(present))
    ids = ids[np.argsort(rank[block], kind="stable")]  # blocks permuted, source order inside
    lengths = bounds[ids.astype(np.int64) + 1] - bounds[ids]
    cuts = cuts_by_bytes(np.cumsum(lengths), buffer_bytes)
    window = np.repeat(np.arange(len(cuts) - 1), np.diff(cuts))
    return ids[np.lexsort((gen.random(len(ids)), window))]


def pls_exchange(index: RecordIndex, spec: ShuffleSpec, world: int) -> Exchange:
    """The exchange of a file's (or pool's) blocks between ``world`` ranks under ``spec``: the
    same on every rank, so a rank's partition of any epoch is known without a plan."""
    spec = resolve_spec(spec, index)
    firsts = index.unit_firsts(spec.block_size)
    order = block_order(index, firsts, rng(spec.seed, UNITS))  # a mixture's: every rank's partition in proportion
    return Exchange(firsts, order, world, float(spec.exchange), spec.seed)


class PartialLocalPlan(OrderPlan):
    """The rank's partition for the epoch, shuffled locally (a fresh uniform permutation)."""

    name = "pls"
    help = "each rank keeps a partition of blocks and trades a fraction (--exchange) of it before every epoch, then shuffles it (partial local shuffling)"

    @functools.cached_property
    def exchange(self) -> Exchange:
        """The exchange of this file's blocks between the ranks (O(blocks + ranks) state)."""
        return pls_exchange(self.index, self.spec, self.world)

    def record_order(self) -> np.ndarray:
        part = self.exchange.partition(self.rank, self.epoch)
        if self.spec.pls_local == "corgipile":
            gen = rng(self.spec.seed, self.epoch, LOCAL_BLOCKS, self.rank)
            buffer = self.spec.buffer_bytes(self.index.data_bytes)  # the rank's, however many parts read it
            return corgipile_order(part, self.index.bounds, self.exchange.firsts, buffer, gen)
        rng(self.spec.seed, self.epoch, LOCAL, self.rank).shuffle(part)
        return part

    def share_counts(self) -> np.ndarray:
        return self.exchange.sizes

    def describe(self) -> dict:
        c = self.exchange.counts(self.rank, self.epoch)
        return {**super().describe(), "exchange": float(self.spec.exchange), "block_size": self.spec.block_size,
                "local": self.spec.pls_local, "partition_records": c["records"], "kept": c["kept"], "received": c["received"], "sent": c["sent"]}
