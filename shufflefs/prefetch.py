"""Windows in memory: loaded on worker threads, shared by every reader, bounded by bytes.

A window is loaded once (big preads in source order, then the gather) by a worker thread and
kept in an LRU shared by all handles of the same view, so concurrent readers of a file cost one
load per window.  Serving window k starts loading window k+1 in the background (double
buffering): a sequential reader finds the next window ready.  Memory is a byte budget that the
filesystem raises by a few windows per open view; a window in use by a read (pinned) or still
loading is never evicted, so the budget can be exceeded transiently, never by wrong bytes.

Buffers of evicted windows are reused for later loads because first-touching fresh memory is
several times slower than the gather itself on the machines this runs on.

Everything here except the loader callables runs in the trio thread.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Hashable

import numpy as np
import trio

log = logging.getLogger("shufflefs")

Loader = Callable[[np.ndarray | None, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]
"""Blocking: ``loader(out, scratch) -> (window bytes, scratch buffer used)``.  The bytes are
written into ``out`` and the source is read through ``scratch`` when they are large enough."""


class Slot:
    """One window: loading, then ready (``data``) or failed (``error``)."""

    __slots__ = ("key", "nbytes", "event", "data", "buf", "error", "pins", "cached")

    def __init__(self, key: Hashable, nbytes: int) -> None:
        self.key = key
        self.nbytes = nbytes  # bytes charged to the budget
        self.event = trio.Event()
        self.data: np.ndarray | None = None
        self.buf: np.ndarray | None = None  # the allocation behind ``data`` (may be larger)
        self.error: BaseException | None = None
        self.pins = 0
        self.cached = False

    @property
    def ready(self) -> bool:
        return self.event.is_set() and self.error is None


class ScratchPool:
    """Source-read buffers for the worker threads: one per concurrent load, reused."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self) -> np.ndarray | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def give(self, buf: np.ndarray | None) -> None:
        if buf is None:
            return
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


class WindowCache:
    """LRU of windows keyed by ``(view_key, k)``, charged by bytes against ``limit``."""

    POOL_BUFFERS = 4

    def __init__(self, limiter: trio.CapacityLimiter, limit: int = 0) -> None:
        self.limiter = limiter
        self.nursery: trio.Nursery | None = None  # where loads run; set before the first one
        self._slots: OrderedDict[Hashable, Slot] = OrderedDict()
        self._budgets: dict[Hashable, int] = {}
        self._floor = limit
        self.limit = limit
        self.resident = 0  # bytes charged by slots in ``_slots`` and by pinned evicted slots
        self._pool: list[np.ndarray] = []
        self._scratch = ScratchPool(int(limiter.total_tokens))
        self.loads = 0

    # ------------------------------------------------------------------ budget

    def reserve(self, owner: Hashable, nbytes: int) -> None:
        """Raise the budget by ``nbytes`` while ``owner`` (an open view) exists."""
        self._budgets[owner] = nbytes
        self.limit = self._floor + sum(self._budgets.values())

    def unreserve(self, owner: Hashable, drop: bool = True) -> None:
        """Forget ``owner``'s budget; ``drop`` its windows too (when no one can read them again)."""
        self._budgets.pop(owner, None)
        self.limit = self._floor + sum(self._budgets.values())
        if drop:
            for key in [k for k in self._slots if isinstance(k, tuple) and k[0] == owner]:
                slot = self._slots[key]
                if slot.event.is_set():
                    self._evict(slot)
        if not self._budgets:
            self._pool.clear()
            self._scratch.clear()
        self._trim()

    @property
    def pooled(self) -> int:
        return sum(b.nbytes for b in self._pool)

    def _evict(self, slot: Slot) -> None:
        del self._slots[slot.key]
        slot.cached = False
        if slot.pins == 0:
            self._recycle(slot)

    def _recycle(self, slot: Slot) -> None:
        """A slot no one can reach any more: return its charge and keep its buffer if room."""
        self.resident -= slot.nbytes
        buf, slot.buf, slot.data = slot.buf, None, None
        if (
            buf is not None
            and len(self._pool) < self.POOL_BUFFERS
            and self.resident + self.pooled + buf.nbytes <= self.limit
        ):
            self._pool.append(buf)

    def _trim(self, need: int = 0) -> bool:
        """Evict until ``need`` more bytes fit; False if pinned/loading windows prevent it."""
        while self._pool and self.resident + self.pooled + need > self.limit:
            self._pool.pop(0)
        if self.resident + need <= self.limit:
            return True
        for slot in list(self._slots.values()):
            if self.resident + need <= self.limit:
                break
            if slot.pins == 0 and slot.event.is_set():
                self._evict(slot)
        return self.resident + need <= self.limit

    def _take_buffer(self, nbytes: int) -> np.ndarray | None:
        """A pooled buffer that holds ``nbytes`` without wasting more than half of itself."""
        best = None
        for i, b in enumerate(self._pool):
            if nbytes <= b.nbytes <= 2 * max(nbytes, 1) and (best is None or b.nbytes < self._pool[best].nbytes):
                best = i
        return self._pool.pop(best) if best is not None else None

    # ------------------------------------------------------------------ loading

    def _start(self, key: Hashable, nbytes: int, loader: Loader) -> Slot:
        if self.nursery is None:
            raise RuntimeError("WindowCache.nursery must be set before loading windows")
        slot = Slot(key, nbytes)
        self._trim(nbytes)
        self._slots[key] = slot
        slot.cached = True
        self.resident += nbytes
        self.nursery.start_soon(self._fill, slot, loader, self._take_buffer(nbytes))
        return slot

    async def _fill(self, slot: Slot, loader: Loader, buf: np.ndarray | None) -> None:
        scratch = self._scratch.take()
        self.loads += 1
        try:
            data, used_scratch = await trio.to_thread.run_sync(loader, buf, scratch, limiter=self.limiter)
        except BaseException as e:  # noqa: BLE001 -- handed to the waiters, never lost
            self._scratch.give(scratch)
            slot.error = e if not isinstance(e, trio.Cancelled) else OSError("load cancelled at shutdown")
            slot.buf = buf
            if slot.cached:
                del self._slots[slot.key]
                slot.cached = False
            if slot.pins == 0:
                self._recycle(slot)
            slot.event.set()
            if isinstance(e, trio.Cancelled):
                raise
            return
        self._scratch.give(used_scratch)
        slot.data = data
        slot.buf = data.base if isinstance(data.base, np.ndarray) and data.base.ndim == 1 and data.base.dtype == np.uint8 else data
        charged = max(slot.buf.nbytes, slot.nbytes)
        self.resident += charged - slot.nbytes
        slot.nbytes = charged
        slot.event.set()
        if not slot.cached and slot.pins == 0:
            self._recycle(slot)
        else:
            self._trim()

    # ------------------------------------------------------------------ public

    def prefetch(self, key: Hashable, nbytes: int, loader: Loader) -> bool:
        """Load in the background if the window fits in the budget; never evicts pinned windows."""
        if key in self._slots or self.nursery is None:
            return False
        if not self._trim(nbytes):
            return False
        self._start(key, nbytes, loader)
        return True

    def pin(self, key: Hashable, nbytes: int, loader: Loader) -> Slot:
        """The window's slot, loading if absent; pinned (never evicted) until `release`."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._start(key, nbytes, loader)
        else:
            self._slots.move_to_end(key)
        slot.pins += 1
        return slot

    @staticmethod
    async def wait(slot: Slot) -> np.ndarray:
        """The bytes of a pinned slot once loaded; raises the load's error (the pin stays)."""
        await slot.event.wait()
        if slot.error is not None:
            raise slot.error
        return slot.data

    async def acquire(self, key: Hashable, nbytes: int, loader: Loader) -> Slot:
        """`pin` and `wait` in one: the ready window, pinned until `release`."""
        slot = self.pin(key, nbytes, loader)
        try:
            await self.wait(slot)
        except BaseException:
            self.release(slot)
            raise
        return slot

    def release(self, slot: Slot) -> None:
        slot.pins -= 1
        if slot.pins == 0:
            if not slot.cached:
                self._recycle(slot)
            elif self.resident + self.pooled > self.limit:
                self._trim()

    def clear(self) -> None:
        for slot in list(self._slots.values()):
            if slot.event.is_set():
                self._evict(slot)
        self._pool.clear()
        self._scratch.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "windows": len(self._slots),
            "window_bytes": self.resident,
            "pooled_bytes": self.pooled,
            "limit_bytes": self.limit,
            "loads": self.loads,
        }


class SharedTasks:
    """Run one computation per key at a time; concurrent callers await the same result.

    Used so that the index of a file is built once even when many processes open it at once.
    Results are not kept here (callers cache what they want); failures reach every waiter.
    """

    def __init__(self) -> None:
        self._running: dict[Hashable, tuple[trio.Event, list]] = {}

    async def run(self, key: Hashable, fn: Callable[[], Awaitable[Any]]) -> Any:
        entry = self._running.get(key)
        if entry is not None:
            event, box = entry
            await event.wait()
        else:
            event, box = trio.Event(), []
            self._running[key] = (event, box)
            try:
                box.append(("ok", await fn()))
            except trio.Cancelled:
                box.append(("err", OSError("shutting down")))
                raise
            except BaseException as e:
                box.append(("err", e))
            finally:
                del self._running[key]
                event.set()
        kind, value = box[0] if box else ("err", OSError("shut down"))
        if kind == "err":
            raise value
        return value
