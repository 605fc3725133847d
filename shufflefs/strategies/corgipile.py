"""CorgiPile (Algorithm 1, §4.1) and its Block-Only ablation (§7.3).

Each epoch the non-empty blocks are permuted; a window takes the next n blocks of the rank's
share (n = buffer // block_size, at least 1) and CorgiPile shuffles the window's records
uniformly.  A mixture's blocks are permuted within each source and the sources' sequences
interleaved by records (`mixture.block_order`), so that every buffer holds each source's
share rather than a random draw of it.  With several ranks the permuted block list is split into contiguous pieces and each
rank shuffles inside its own buffer (multi-process CorgiPile, §5).  Both strategies draw the same
block permutation, so Block-Only is exactly CorgiPile without the in-window shuffle.

The plan holds O(blocks) state; a window's records are produced only when it is asked for.
"""

from __future__ import annotations

import numpy as np

from .base import rng
from .mixture import block_order
from .units import UnitPlan, cuts_by_count, salt

BLOCKS = salt("corgipile/blocks")
RECORDS = salt("corgipile/records")


class BlockOnlyPlan(UnitPlan):
    """Blocks permuted each epoch; records in source order inside each block."""

    name = "block"
    help = "blocks permuted every epoch, records in source order inside blocks (Block-Only Shuffle)"
    unit_label = "blocks"

    @property
    def blocks_per_window(self) -> int:
        return max(1, self.buffer_bytes // self.spec.block_size)

    def unit_order(self, n_units: int) -> np.ndarray:
        return block_order(self.index, self.firsts, rng(self.spec.seed, self.epoch, BLOCKS))

    def window_cuts(self, cum: np.ndarray) -> np.ndarray:
        return cuts_by_count(len(cum), self.blocks_per_window)

    def describe(self) -> dict:
        return {**super().describe(), "block_size": self.spec.block_size,
                "blocks_per_window": self.blocks_per_window}


class CorgiPilePlan(BlockOnlyPlan):
    """Block-Only plus a uniform shuffle of each window's records (keyed by rank and window)."""

    name = "corgipile"
    help = "blocks permuted, then buffer-sized groups of blocks shuffled record by record (CorgiPile)"

    def arrange(self, k: int, ids: np.ndarray) -> np.ndarray:
        part = () if self.parts == 1 else (self.part, self.parts)
        rng(self.spec.seed, self.epoch, RECORDS, self.rank, k, *part).shuffle(ids)
        return ids
