"""The tf.data sliding-window shuffle baseline (CorgiPile paper §3.3).

A buffer of B records is filled in source order; each step emits a uniformly chosen buffered
record and puts the next source record in its slot; at the end the buffer drains in random
order.  The process is sequential, but its outcome is not: the record emitted at step t is
whatever the chosen slot last received, i.e. the record put there at the previous step that
chose the same slot (or the slot's initial record).  Grouping the steps by slot with one stable
sort gives the whole order in numpy, O(m log m) for the rank's m records.
"""

from __future__ import annotations

import numpy as np

from .base import rng
from .units import OrderPlan, id_dtype, permutation, salt, share

WINDOW = salt("window/steps")
PICK_CHUNK = 1 << 16
"""Slot draws made at a time (numpy's bounded draws are the same whether made in one call or in
chunks): the int64 draws never take 8 bytes per record at once."""
GROUP_STEPS = 1 << 18
"""Steps ordered at a time, by slot group (see ``sliding_window_order``)."""


def sliding_window_order(m: int, picks: np.ndarray, drain: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Output order (positions 0..m-1 of the source range, as ``dtype``) of a sliding window.

    ``picks[t]`` is the slot chosen at step t (``m - B`` steps, slots 0..B-1) and ``drain`` the
    order in which the B slots are emptied at the end.
    """
    B = len(drain)
    steps = m - B
    if len(picks) != steps:
        raise ValueError("need one pick per record beyond the buffer")
    out = np.empty(m, dtype)
    final = np.arange(B, dtype=dtype)
    # a slot's steps only depend on each other, so slots are handled in groups of about
    # GROUP_STEPS steps: the int64 sort indices never take 8 bytes per record at once (this runs
    # in the daemon, whose peak memory is budgeted per record)
    groups = max(1, min(B, -(-steps // GROUP_STEPS)))
    edges = np.linspace(0, B, groups + 1).astype(np.int64)
    key_dtype = np.min_scalar_type(max(B - 1, 0))
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        sel = np.flatnonzero((picks >= a) & (picks < b)) if groups > 1 else None
        keys = picks if sel is None else picks[sel]
        if not len(keys):
            continue
        # narrow keys let numpy's stable sort use radix sort (several times faster for B <= 65536)
        order = np.argsort(keys.astype(key_dtype, copy=False), kind="stable")
        slot = keys[order]
        order = (order if sel is None else sel[order]).astype(dtype, copy=False)
        del sel, keys
        first = np.ones(len(order), bool)
        first[1:] = slot[1:] != slot[:-1]
        prev = np.empty(len(order), dtype)
        prev[0] = 0
        prev[1:] = order[:-1]
        prev += B
        prev[first] = slot[first]
        out[order] = prev
        del prev
        last = np.ones(len(order), bool)
        last[:-1] = first[1:]
        final[slot[last]] = B + order[last]
    out[steps:] = final[drain]
    return out


class SlidingWindowPlan(OrderPlan):
    """Sliding window of B records over the rank's contiguous source range.

    B = buffer bytes / mean record view length (at least 1).  With several ranks the source
    records are split into contiguous ranges first and each rank slides its own window.
    """

    name = "window"
    help = "sliding window of buffer-sized record pool over the source order (tf.data shuffle)"

    @property
    def buffer_records(self) -> int:
        n = self.index.n
        if n == 0:
            return 1
        return max(1, int(round(self.buffer_bytes * n / self.index.data_bytes)))

    def record_order(self) -> np.ndarray:
        lo, hi = share(self.index.n, self.rank, self.world)
        m = hi - lo
        B = min(self.buffer_records, m)
        gen = rng(self.spec.seed, self.epoch, WINDOW, self.rank)
        picks = np.empty(m - B, np.min_scalar_type(max(B - 1, 0)))
        for lo_ in range(0, len(picks), PICK_CHUNK):  # the draws of one call, in fewer bytes
            hi_ = min(lo_ + PICK_CHUNK, len(picks))
            picks[lo_:hi_] = gen.integers(0, B, size=hi_ - lo_, dtype=np.int64)
        drain = permutation(gen, B)  # gen.permutation(B)'s order in 4-byte ids (the plan's peak memory)
        out = sliding_window_order(m, picks, drain, id_dtype(hi))
        out += lo
        return out

    def describe(self) -> dict:
        return {**super().describe(), "buffer_records": self.buffer_records}
