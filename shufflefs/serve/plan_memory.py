"""Memory for plans: record-level plans hold every record id, so epochs read at once take turns.

A plan of ``full``, ``once``, ``window``, ``lirs-page`` or ``--balance`` holds the order of all its
records (4 bytes each below 2**31 records); block plans hold O(blocks).  The memory bound the
docs/performance.md states (16 bytes per record + 3 windows + 100 MiB) leaves `PLAN_BYTES_PER_RECORD` per
record of each file beside its offset table: room for two epochs' record-level plans of a file.
Readers of more epochs of one file at once (32 readers each opening a new epoch while the epoch
changes every 5 ms) held 32 plans, 190 MB on top of the bound for 1.5 M records.  Now the plan of
one more epoch waits until an older one is let go: plans of views no handle has open are dropped
first (they are rebuilt when opened again), and otherwise the open waits for a reader to close its
file, or for `PLAN_WAIT` seconds without any plan let go or window loaded, after which it is built
anyway (a reader that keeps old epochs open without reading must not block the others for ever).

Runs in the trio thread only; no FUSE here.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable, Hashable

import numpy as np
import trio

from ..strategies import STRATEGIES
from ..strategies.slices import SlicePlan
from ..strategies.units import OrderPlan, id_dtype

PLAN_BYTES_PER_RECORD = 8
PLAN_SLACK = 1 << 20
"""Bytes per file allowed beyond `PLAN_BYTES_PER_RECORD` (a plan's window cuts and sizes)."""
MIX_BYTES_PER_RECORD = 16
"""A mixture's epoch holds an offset table of 8 bytes per record and builds it from arrays of as
many; one whose samples would need more than half the machine's memory is refused."""
PLAN_WAIT = 5.0
PROGRESS_POLL = 0.05


def physical_memory() -> int:
    """Bytes of memory of this machine (a large figure where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 50


def plan_nbytes(plan: object) -> int:
    """Bytes of the arrays a plan (and a plan it wraps) holds, each allocation counted once.  A
    pool shard's plan is a stretch of its pool's stream, which all shards share: not counted; a
    resumed view's plans (`strategies.resume.ResumedPlan.sources`) are its own: counted."""
    seen: set[int] = set()
    total = 0
    todo = [plan]
    while todo:
        obj = todo.pop()
        for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
            if isinstance(value, np.ndarray):
                base = value
                while isinstance(base.base, np.ndarray):
                    base = base.base
                if id(base) not in seen:
                    seen.add(id(base))
                    total += base.nbytes
            elif hasattr(value, "window_sizes") and not isinstance(obj, SlicePlan):  # a wrapped plan
                todo.append(value)
            elif isinstance(value, list) and value and hasattr(value[0], "window_sizes") and not isinstance(obj, SlicePlan):
                todo.extend(value)  # the plans a resumed view reads from (its pieces and their sources)
    return total


def plan_estimate(strategy: str, balance: bool, records: int) -> int:
    """Bytes a plan of ``records`` will hold, before it is built (record-level plans only)."""
    if balance or issubclass(STRATEGIES.get(strategy, OrderPlan), OrderPlan):
        return np.dtype(id_dtype(records)).itemsize * records
    return 0


class PlanMemory:
    """Plans' bytes, per holder (a view node), against `PLAN_BYTES_PER_RECORD` per record of
    every file that has a plan."""

    def __init__(self, per_record: int = PLAN_BYTES_PER_RECORD) -> None:
        self.per_record = per_record
        self._held: OrderedDict[Hashable, tuple[Hashable, int]] = OrderedDict()  # holder -> (file, bytes)
        self._files: dict[Hashable, list[int]] = {}  # file -> [records, plans]
        self.used = 0
        self.waited = 0  # plans that waited for room
        self.over = 0  # plans built over the allowance after PLAN_WAIT
        self._changed = trio.Event()

    def allowance(self, file: Hashable | None = None, records: int = 0) -> int:
        total = sum(r for r, _ in self._files.values())
        if file is not None and file not in self._files:
            total += records
        return self.per_record * total + PLAN_SLACK * (len(self._files) + (file is not None and file not in self._files))

    def holders(self) -> list[Hashable]:
        """Holders of plans, least recently charged first."""
        return list(self._held)

    async def admit(self, holder: Hashable, file: Hashable, records: int, need: int,
                    make_room: Callable[[], bool], progress: Callable[[], int] = lambda: 0) -> None:
        """Return once a plan of ``need`` bytes for ``file`` (of ``records`` records) fits, with
        those bytes reserved for ``holder`` (until `charge` or `release`); ``make_room()`` drops
        one unused plan and says whether it did.  The wait goes on while ``progress()`` (a count
        of windows loaded) grows: the readers holding plans are still reading, and close in turn."""
        changed = trio.current_time()
        seen = progress()
        waited = False
        while need and self.used + need > self.allowance(file, records):
            if make_room():
                continue
            now = trio.current_time()
            if progress() != seen:
                changed, seen = now, progress()
            if now - changed >= PLAN_WAIT:
                self.over += 1
                break
            if not waited:
                self.waited, waited = self.waited + 1, True
            with trio.move_on_after(PROGRESS_POLL):
                await self._changed.wait()
        self.charge(holder, file, records, need)

    def charge(self, holder: Hashable, file: Hashable, records: int, nbytes: int) -> None:
        self.release(holder)
        self._held[holder] = (file, nbytes)
        entry = self._files.setdefault(file, [records, 0])
        entry[1] += 1
        self.used += nbytes

    def release(self, holder: Hashable) -> None:
        got = self._held.pop(holder, None)
        if got is None:
            return
        file, nbytes = got
        self.used -= nbytes
        entry = self._files[file]
        entry[1] -= 1
        if entry[1] == 0:
            del self._files[file]
        self._changed.set()
        self._changed = trio.Event()

    def describe(self) -> dict[str, int]:
        return {"plan_bytes": self.used, "plan_allowance": self.allowance(), "plans": len(self._held),
                "plans_waited": self.waited, "plans_over": self.over}
