"""LIRS: a full random permutation every epoch, by record or by page (LIRS §4.1)."""

from __future__ import annotations

import numpy as np

from .base import rng
from .units import OrderPlan, UnitPlan, permutation, salt, share

FULL = salt("full/records")
PAGES = salt("lirs-page/pages")


class FullShufflePlan(OrderPlan):
    """A fresh uniform permutation of all records each epoch (Epoch Shuffle; LIRS by record).

    The same permutation on every rank; rank r takes the r-th contiguous piece of it.
    """

    name = "full"
    help = "a fresh random permutation of all records every epoch (LIRS, Epoch Shuffle)"

    def record_order(self) -> np.ndarray:
        perm = permutation(rng(self.spec.seed, self.epoch, FULL), self.index.n)
        lo, hi = share(len(perm), self.rank, self.world)
        return perm[lo:hi].copy() if self.world > 1 else perm


class PageShufflePlan(UnitPlan):
    """LIRS page-aware shuffling: pages are the shuffling unit, permuted each epoch.

    A page owns the records whose first byte lies in it.  Records of a page stay together in
    source order, as in LIRS where a page's instances go into the same batch: every page of the
    source is then read once, front to back.  Windows are consecutive pages of about the buffer's
    bytes; with several ranks, rank r takes the r-th contiguous piece of the page permutation.
    """

    name = "lirs-page"
    help = "pages of page_size bytes permuted every epoch, records of a page kept together (LIRS page-aware)"
    unit_label = "pages"

    def unit_size(self) -> int:
        return self.spec.page_size

    def unit_order(self, n_units: int) -> np.ndarray:
        return rng(self.spec.seed, self.epoch, PAGES).permutation(n_units).astype(np.int64, copy=False)

    def describe(self) -> dict:
        return {**super().describe(), "page_size": self.spec.page_size}
