"""Plan -> bytes: where each window sits in the view, which source ranges it needs, and its assembly.

The view of a file is ``header | window 0 | window 1 | ... | trailer``.  A window's bytes are
built from its records alone, so any ``read(off, size)`` only needs the windows it overlaps.
Reading a window's records is planned as few, large reads in source order (`source_runs`):
consecutive record ids are adjacent in the source and merge into one run.

`assemble` builds a window here for any `Fetch` (reading every run, then gathering the records
into view order with `sources.base.gather`); it is the reference `render` and the tests use, and the daemon's fallback when
the compiled `_gather.build_window` (see `view`) is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..index.table import RecordIndex
from ..sources.base import gather
from ..strategies.base import Plan

HEADER = -1
TRAILER = -2


@dataclass(frozen=True)
class Piece:
    """Part of a read: bytes ``[lo, hi)`` of window ``part`` (or of the header / trailer)."""

    part: int
    lo: int
    hi: int


class Layout:
    """Virtual offsets of header, windows and trailer; O(windows) memory."""

    def __init__(self, index: RecordIndex, plan: Plan, header_size: int | None = None,
                 trailer_size: int | None = None) -> None:
        """Header and trailer are the index's own unless given (a pool's shard shows its member's)."""
        self.index = index
        self.plan = plan
        sizes = np.asarray(plan.window_sizes, dtype=np.int64)
        self.header_size = index.header_end if header_size is None else header_size
        self.trailer_size = index.size - index.trailer_start if trailer_size is None else trailer_size
        self.window_starts = self.header_size + np.concatenate(([0], np.cumsum(sizes)))
        self.trailer_offset = int(self.window_starts[-1])
        self.size = self.trailer_offset + self.trailer_size

    @property
    def n_windows(self) -> int:
        return len(self.window_starts) - 1

    def window_size(self, k: int) -> int:
        return int(self.window_starts[k + 1] - self.window_starts[k])

    def pieces(self, off: int, size: int) -> list[Piece]:
        """Split the virtual range ``[off, off+size)`` (clipped at EOF) into per-part pieces."""
        end = min(off + size, self.size)
        out: list[Piece] = []
        if off >= end:
            return out
        if off < self.header_size:
            out.append(Piece(HEADER, off, min(end, self.header_size)))
        lo, hi = max(off, self.header_size), min(end, self.trailer_offset)
        if lo < hi:
            k = int(np.searchsorted(self.window_starts, lo, side="right")) - 1
            while lo < hi:
                # skip empty windows: they own no bytes
                ws, we = int(self.window_starts[k]), int(self.window_starts[k + 1])
                if we > lo:
                    out.append(Piece(k, lo - ws, min(hi, we) - ws))
                    lo = min(hi, we)
                k += 1
        if end > self.trailer_offset:
            t = self.trailer_offset
            out.append(Piece(TRAILER, max(off, t) - t, end - t))
        return out


def id_runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ids as ascending runs of consecutive ids: ``(first id, count)`` of each run."""
    s = np.sort(ids)
    if len(s) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    brk = np.flatnonzero(np.diff(s) != 1) + 1
    rstart = np.concatenate(([0], brk))
    return s[rstart].astype(np.int64, copy=False), np.diff(np.append(rstart, len(s))).astype(np.int64)


def source_runs(index: RecordIndex, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Source byte ranges holding records ``ids``, merged and in ascending order.

    Returns ``(starts, ends)``.  Records tile the data region, so a run of consecutive ids is one
    contiguous range: a CorgiPile window becomes one read per block run, ``full`` one per record.
    """
    s = np.sort(ids)
    if len(s) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    breaks = np.flatnonzero(np.diff(s) != 1) + 1
    first = s[np.concatenate(([0], breaks))]
    last = s[np.concatenate((breaks - 1, [len(s) - 1]))]
    return index.bounds[first], index.bounds[last + 1]


Fetch = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""Reads source ranges ``(starts, ends)`` and returns their bytes concatenated (uint8 array)."""


def assemble(index: RecordIndex, ids: np.ndarray, fetch: Fetch, out: np.ndarray | None = None,
             stepwise: bool = False) -> np.ndarray:
    """The view bytes of records ``ids`` in that order.

    ``fetch`` does the I/O (a pread loop in the daemon, a slice of an in-memory file in tests),
    so this one function defines the bytes everywhere.  ``stepwise``: fetch a few MiB at a time
    (`assemble_steps`), ``fetch`` being a source's ``read_runs`` (it takes a buffer to fill:
    `reusing`).
    """
    if stepwise:
        return assemble_steps(index, ids, reusing(fetch), out)
    ids = np.asarray(ids, dtype=np.int64)
    lengths = index.record_lengths(ids)
    out_len = index.out_lengths(ids)
    total = int(out_len.sum())
    if out is None or len(out) < total:
        out = np.empty(total, np.uint8)
    else:
        out = out[:total]
    if len(ids) == 0:
        return out
    starts, ends = source_runs(index, ids)
    src = fetch(starts, ends)
    if len(src) != int((ends - starts).sum()):
        raise ValueError("fetch returned the wrong number of bytes")

    # position of each record inside ``src``: records sorted by id are laid out back to back
    order = np.argsort(ids, kind="stable")
    src_pos_sorted = np.concatenate(([0], np.cumsum(lengths[order])[:-1]))
    src_pos = np.empty_like(src_pos_sorted)
    src_pos[order] = src_pos_sorted
    out_pos = np.concatenate(([0], np.cumsum(out_len)[:-1]))
    gather(src, src_pos, lengths, out, out_pos)
    if len(index.newline_ids):
        hit = np.flatnonzero(np.isin(ids, index.newline_ids))
        out[out_pos[hit] + lengths[hit]] = 0x0A
    return out


STEP_BYTES = 4 << 20
"""Source bytes fetched at a time by `assemble_steps` (a load's scratch: the daemon's memory of
a gzip view, two loads in flight, was within 2 MiB of its bound with 8 MiB steps)."""


def reusing(read_runs: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> Fetch:
    """A `Fetch` by ``read_runs(starts, ends, out)`` into one buffer, grown when a fetch needs
    more, for `assemble_steps`, which is done with a step's bytes before it fetches the next (a
    new buffer per step was mapped and faulted in anew: about 0.2 s of CPU per GiB)."""
    scratch = np.empty(0, np.uint8)

    def fetch(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        nonlocal scratch
        need = int((ends - starts).sum())
        if len(scratch) < need:
            scratch = np.empty(need, np.uint8)
        return read_runs(starts, ends, scratch)

    return fetch


def assemble_steps(index: RecordIndex, ids: np.ndarray, fetch: Fetch, out: np.ndarray | None = None,
                   step: int = STEP_BYTES) -> np.ndarray:
    """`assemble`, fetching the records' runs in ascending order about ``step`` bytes at a time
    and putting each step's records in place before the next: for a source that reads runs one
    after another anyway (a compressed file's decoded bytes, `sources.decoded`), the same bytes
    with ``step`` bytes of scratch instead of a window's."""
    ids = np.asarray(ids, dtype=np.int64)
    lengths = index.record_lengths(ids)
    out_len = index.out_lengths(ids)
    total = int(out_len.sum())
    out = np.empty(total, np.uint8) if out is None or len(out) < total else out[:total]
    if len(ids) == 0:
        return out
    out_pos = np.cumsum(out_len) - out_len
    order = np.argsort(ids, kind="stable")  # the records in source order
    ends = np.cumsum(lengths[order])
    cuts = np.unique(np.concatenate(([0], np.searchsorted(ends, np.arange(step, int(ends[-1]), step)) + 1,
                                     [len(ids)])))
    for g0, g1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        part = order[g0:g1]
        starts, stops = source_runs(index, ids[part])
        src = fetch(starts, stops)
        if len(src) != int((stops - starts).sum()):
            raise ValueError("fetch returned the wrong number of bytes")
        gather(src, np.cumsum(lengths[part]) - lengths[part], lengths[part], out, out_pos[part])
    if len(index.newline_ids):
        hit = np.flatnonzero(np.isin(ids, index.newline_ids))
        out[out_pos[hit] + lengths[hit]] = 0x0A
    return out


def render(index: RecordIndex, plan: Plan, data: bytes | np.ndarray) -> bytes:
    """The whole view as bytes, from the source in memory: the reference every read must match."""
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    fetch = slice_fetch(buf)
    parts = [bytes(buf[: index.header_end])]
    for k in range(plan.n_windows):
        parts.append(assemble(index, plan.window(k), fetch).tobytes())
    parts.append(bytes(buf[index.trailer_start:]))
    return b"".join(parts)


def slice_fetch(buf: np.ndarray) -> Fetch:
    """A `Fetch` over an in-memory copy of the source."""

    def fetch(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        if len(starts) == 1:
            return buf[int(starts[0]): int(ends[0])]
        return np.concatenate([buf[int(s): int(e)] for s, e in zip(starts, ends)])

    return fetch
