"""Stratified CorgiPile: every buffer takes one block from each stretch of the file.

CorgiPile fills a buffer with n blocks drawn at random, so on data sorted by label (or time, or
source) a buffer's label counts are multinomial over the blocks: 16 one-label blocks of 10 labels
leave a buffer's mix 0.31 from the file's (total variation), and the mix improves only as
1/sqrt(n).  Stratified sampling removes that draw: with G buffers in the epoch, the file's blocks
(rotated by a random offset each epoch) are cut into strata of G consecutive blocks, each stratum
deals its blocks to the G buffers in a random order, one per buffer, and each buffer's records are
shuffled as CorgiPile does.  A buffer then holds one block of every stretch of the file, each
stretch of equal weight, so a sorted file's buffers carry the file's label mix to within one block
per label; on data whose order carries no trend it draws like CorgiPile.  The I/O is CorgiPile's:
n blocks at random offsets per buffer, each read whole.

Every block still lands in a uniformly random group of its stratum, so every record's epoch
position is uniform over the epoch's groups.  Groups are sized by the rank's buffer (not a
loader part's), so ranks and parts of any split compute the same unit order; a window never
spans two groups and holds at most a part's buffer of blocks.
"""

from __future__ import annotations

import numpy as np

from .base import rng
from .corgipile import CorgiPilePlan
from .units import I64, salt

STRATA = salt("stratified/strata")


def stratified_order(n_units: int, per_group: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's unit order and where each group starts in it (int64, groups + 1 entries).

    There are ``G = ceil(n_units / per_group)`` groups.  Units ``0..n_units-1`` (in file order,
    rotated by a random offset) are cut into strata of G consecutive units (the last one
    shorter); each stratum deals its units to the groups by a random permutation of the groups
    (the short one to a random subset), and each group's units come in random order.  Strata of
    equal length give every stretch of the file the same weight in every group, so a group of
    ``s = ceil(n_units / G)`` units (or one fewer) holds the file's mix.  O(units) memory and
    time (a sort).
    """
    if n_units <= 0:
        return np.zeros(0, I64), np.zeros(1, I64)
    groups = -(-n_units // max(1, int(per_group)))
    strata = -(-n_units // groups)
    small = np.int32 if groups < 2**31 and n_units < 2**31 else I64  # half the bytes of int64
    # row s: the group each unit of stratum s goes to (a permutation of the groups); row-major,
    # so unit position p (stratum p // groups, place p % groups) reads entry p
    slots = gen.permuted(np.broadcast_to(np.arange(groups, dtype=small), (strata, groups)), axis=1)
    group = slots.reshape(-1)[:n_units]
    del slots
    inside = gen.permutation(n_units).astype(small, copy=False)  # random order inside a group...
    inside = inside[np.argsort(group[inside], kind="stable")]  # ...kept by a stable sort by group
    starts = np.concatenate((np.zeros(1, I64), np.cumsum(np.bincount(group, minlength=groups)))).astype(I64)
    inside = inside.astype(I64)
    inside += int(gen.integers(n_units))
    inside %= n_units
    return inside, starts


class StratifiedPlan(CorgiPilePlan):
    """CorgiPile whose buffers are stratified samples of the file's blocks (module docstring)."""

    name = "stratified"
    help = ("CorgiPile with stratified buffers: each buffer takes one random block from each of n equal "
            "stretches of the file, then its records are shuffled (the default)")

    @property
    def group_blocks(self) -> int:
        """Blocks per group: the rank's buffer (all parts) over the block size, at least 1."""
        return max(1, self.spec.buffer_bytes(self.index.data_bytes) // self.spec.block_size)

    def unit_order(self, n_units: int) -> np.ndarray:
        order, self.group_starts = stratified_order(n_units, self.group_blocks,
                                                    rng(self.spec.seed, self.epoch, STRATA))
        return order

    def window_cuts(self, cum: np.ndarray) -> np.ndarray:
        """A new window at every group start, and every part's buffer of blocks inside a group."""
        m = len(cum)
        if m == 0:
            return np.zeros(1, I64)
        pos = np.arange(self.first_position, self.first_position + m, dtype=I64)
        g = np.searchsorted(self.group_starts, pos, side="right") - 1
        key = g * (self.group_blocks + 1) + (pos - self.group_starts[g]) // self.blocks_per_window
        inner = np.flatnonzero(key[1:] != key[:-1]) + 1
        return np.concatenate((np.zeros(1, I64), inner.astype(I64), np.full(1, m, I64)))

    def describe(self) -> dict:
        groups = len(self.group_starts) - 1
        return {**super().describe(), "strata": -(-(len(self.firsts) - 1) // max(1, groups)), "groups": groups}
