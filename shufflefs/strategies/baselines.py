"""The two ends of the range: No Shuffle and Shuffle Once (CorgiPile paper §3.1-3.2)."""

from __future__ import annotations

import numpy as np

from .base import rng
from .units import OrderPlan, UnitPlan, permutation, salt, share

ONCE = salt("once/records")


class NoShufflePlan(UnitPlan):
    """Source order; windows are consecutive blocks of about the buffer's bytes.

    With several ranks each rank reads one contiguous source range (whole blocks).
    """

    name = "none"
    help = "source order (no shuffle)"
    unit_label = "blocks"

    def describe(self) -> dict:
        return {**super().describe(), "block_size": self.spec.block_size}


class ShuffleOncePlan(OrderPlan):
    """One uniform permutation of all records, drawn from the seed alone and kept every epoch.

    Stands for a dataset shuffled once offline; the rank shares are fixed too.
    """

    name = "once"
    help = "one random permutation of all records, the same every epoch (Shuffle Once)"

    def record_order(self) -> np.ndarray:
        perm = permutation(rng(self.spec.seed, ONCE), self.index.n)
        lo, hi = share(len(perm), self.rank, self.world)
        return perm[lo:hi].copy() if self.world > 1 else perm
