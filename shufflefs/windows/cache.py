"""Windows in memory: loaded on worker threads, shared by every reader, bounded globally.

One design for every strategy and reader:

* A window is loaded once, by a worker thread (`View.load_window`: one pass over its source
  runs in ascending order), into an LRU shared by all handles of its view, so concurrent readers
  of a file cost one load per window.
* Two windows ahead: when a sequential reader enters window k, windows k+1 and k+2 start
  loading (`prefetch`, called by `serve.reads`) if they fit, so that window k+1 is built while k is
  served and two loads can run at once.  Measured on the 2-core VM this was tuned on (warm page
  cache, 2 GiB of ~1 KiB JSON lines, 64 MiB windows, 1 MiB reads): a `corgipile` load took
  33-52 ms next to the FUSE thread and the reader, serving a window about 20 ms, the reader
  waited for nearly every window, and 40% of the CPU time was idle.  One window ahead read
  corgipile/full/lirs-page/block at 2.0-2.1/2.2-2.5/2.1-2.3/2.7-2.8 GB/s, two ahead at
  2.2-2.5/2.8-3.0/2.4-2.6/2.8-2.9 (medians of three epochs, two alternating rounds; `none` 2.6-3.0
  either way); cold (cache dropped before each epoch) corgipile 1.13-1.18 -> 1.43-1.56.
* Memory: all windows together, with the working memory of the loads running (ids, runs and view
  positions: `view.window_work`), are held to ``limit`` = `WINDOWS` x the largest window of the
  views in memory (the window being read and the two ahead; or one ahead and one spare for a read
  across a window boundary, a second reader or a load's working memory), plus the working memory
  of two loads when that is under a quarter of a window, else of one load beyond a window (records
  of a few bytes).  With the work added on top instead, 32 readers of 32 epochs peaked at 360 MiB
  against 247 MiB this way, at the same throughput.  A window that a read is copying from (pinned)
  or that an open handle is reading (held) is never evicted.  Windows already read go first; a
  window prefetched but not read yet is given up only to a read that needs room, never to another
  prefetch.  When more handles read different windows at once than fit, reads wait for room in
  the order they asked (`WindowCache.room`): a handle lets go of its window before it asks for
  the next and then queues behind the reads already waiting, held windows unread for `HOLD_IDLE`
  give way, and readers take turns; the limit is exceeded only when the first read in line has
  waited `ROOM_WAIT` seconds.  Buffers faulted in ahead count while they are (`_warm_buffers`),
  and a prefetch that finds no room but theirs waits for them (`_prefetch_warmed`).
* Buffers are reused: an evicted window's buffer joins a free list and the next load writes
  into it.  On that VM the first writes to fresh memory cost more than building the window:
  scattering 64 MiB of 1 KiB records took 150 ms into fresh numpy memory (transparent huge
  pages), 34 ms into a ``MAP_POPULATE`` mapping of 4 KiB pages, 9-10 ms into huge pages written
  before and 11-13 ms into 4 KiB pages written before.  Served through the mount, huge pages
  gave 1.7-2.2 GB/s once their buffers were reused against 1.55-1.75 GB/s for 4 KiB pages, so
  buffers are plain numpy arrays (huge pages), kept while any view is open or idle.  When a view
  registers, the buffers of its next windows are faulted in ahead on a worker thread of their
  own (`touched_buffer`, within the limit) while its first window loads into a buffer of its own.
  Measured (2 GiB of JSON lines, warm, 64 MiB windows, 1 MiB reads of a fresh mount): in
  `tools/bench.py` the first pass of `none`/`corgipile`/`block` read 0.78/0.88/0.90x their later
  passes, against 0.61/0.56/0.56x before; the daemon's peak RSS unchanged (VmHWM 188-194 MB).

Everything here except the loader callables runs in the trio thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Hashable

import numpy as np
import trio

from ..errors import ShuffleError
from .slots import Readahead, Slot, new_buffer, touched_buffer

log = logging.getLogger("shufflefs")

WINDOWS = 3
"""Windows of the largest view that all windows together may take (see the module docstring)."""
AHEAD = 2
"""Windows a sequential reader has loaded ahead of the one it reads (entering window k asks for
k+1 .. k+AHEAD), so that two loads can run at once; each only if it fits (see the module
docstring)."""
REMOTE_LOADS = 32
"""Window loads of remote sources that may run at once: they mostly wait for the network (their
requests share the store's own cap, ``--requests``), so the CPU's load limit does not apply."""
HOLD_IDLE = 0.25
"""Seconds a held window must go unread before a waiting read may take its memory."""
ROOM_WAIT = 5.0
"""Seconds the first read in line for memory waits for room before it loads over the limit (a
load stuck on a hung source would otherwise keep every reader waiting).  Counted from when its
turn came, not reset by other windows landing."""
__all__ = ["AHEAD", "WINDOWS", "Loader", "Readahead", "Slot", "WindowCache", "new_buffer", "touched_buffer"]
Loader = Callable[[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]
"""Blocking: ``loader(out, scratch) -> (window bytes, scratch used)``.  The window is built in
``out`` (always large enough) and the source read through ``scratch`` if it is large enough
(else the loader allocates one and returns it, for reuse)."""


class WindowCache:
    """LRU of windows keyed by ``(owner, k)``; ``owner`` is a view registered with `register`."""

    def __init__(self, limiter: trio.CapacityLimiter, windows: int = WINDOWS) -> None:
        self.limiter = limiter
        self.windows = windows
        self.nursery: trio.Nursery | None = None  # where loads run; set before the first one
        self._slots: OrderedDict[Hashable, Slot] = OrderedDict()  # least recently used first
        self._largest: dict[Hashable, int] = {}
        self._span: dict[Hashable, int] = {}
        self._work: dict[Hashable, int] = {}
        self._ahead: dict[Hashable, Readahead] = {}
        self.remote_limiter = trio.CapacityLimiter(REMOTE_LOADS)
        self._free: list[np.ndarray] = []
        self._scratch: list[np.ndarray] = []
        self.limit = 0
        self.resident = 0  # bytes of the buffers of every slot (cached or still busy) and of loads' work
        self.loads = 0
        self.prefetched = 0
        self.revoked = 0
        self.over_limit = 0  # loads started over the limit, first in line for ROOM_WAIT seconds
        self.landed = 0  # loads ended (a sign of progress for whoever waits for readers)
        self._in_flight = 0  # loads running
        self._queue: deque[trio.Event] = deque()  # reads waiting for room, in the order they asked
        self._changed = trio.Event()  # set (and replaced) whenever memory may have become free
        self._warmed = trio.Event()  # unset while buffers are being faulted in (`_warm_buffers`)
        self._warmed.set()
        self._warm_limiter = trio.CapacityLimiter(1)
        self.recycled: Callable[[Slot], None] = lambda slot: None  # told before a buffer is reused or dropped
        self.touched: Callable[[], None] = lambda: None  # asked to bring reads' `Slot.used` up to date

    # ------------------------------------------------------------------ views and the limit

    def register(self, owner: Hashable, largest: int, work: int = 0, ahead: Readahead | None = None,
                 span: int = 0) -> None:
        """A view whose windows may be loaded; ``largest`` is its largest window in bytes and
        ``work`` the most memory a load of one of them works with besides the window.  A view of
        a remote source gives its ``ahead``: sequential readers then keep that many bytes loading
        (`ahead_windows`), and the limit makes room for its cap.  ``span``: bytes the view's windows
        may take together if more than `WINDOWS` of its largest (a Parquet view's windows are
        pieces of its row groups: its limit is three row groups)."""
        self._largest[owner] = max(1, int(largest))
        self._span[owner] = max(self.windows * self._largest[owner], int(span))
        self._work[owner] = max(0, int(work))
        if ahead is not None:
            self._ahead[owner] = ahead
        self._set_limit()
        self._warm()

    def unregister(self, owner: Hashable) -> None:
        """The view is gone: drop its windows (loads in flight are dropped when they end)."""
        self._largest.pop(owner, None)
        self._span.pop(owner, None)
        self._work.pop(owner, None)
        self._ahead.pop(owner, None)
        for slot in [s for s in self._slots.values() if s.owner == owner]:
            self._drop(slot)
        self._set_limit()

    def _set_limit(self) -> None:
        # room for two loads' working memory (`AHEAD`) when it is small next to a window; else a
        # load's work fits in the spare window, unless it is larger (records of a few bytes)
        largest = max(self._largest.values(), default=0)
        work = max(self._work.values(), default=0)
        extra = AHEAD * work if AHEAD * work <= largest // 4 else max(0, work - largest)
        remote = max((2 * self._largest[o] + a.cap for o, a in self._ahead.items()), default=0)
        self.limit = max(max(self._span.values(), default=0), remote) + extra
        self._trim()
        if not self._largest:
            self._free.clear()
            self._scratch.clear()

    def _warm(self) -> None:
        """Fault in the buffers the next windows will need while the first one loads, on a
        worker thread of its own: a daemon's first windows otherwise pay for touching fresh
        memory (see the module docstring) in the reader's wait."""
        if self.nursery is None or not self._warmed.is_set():
            return
        size = max(self._largest.values(), default=0)
        have = sum(b.nbytes >= size for b in self._free) + sum(s.nbytes >= size for s in self._slots.values())
        if size and have < self.windows - 1:  # the first load makes its own
            self._warmed = trio.Event()
            self.nursery.start_soon(self._warm_buffers, size, self.windows - 1 - have)

    async def _warm_buffers(self, size: int, count: int) -> None:
        try:
            for _ in range(count):
                if size != max(self._largest.values(), default=0) or self.resident + self.pooled + size > self.limit:
                    return
                self.resident += size  # while faulted in (else the first loads took its room: a window over)
                try:
                    buf = await trio.to_thread.run_sync(touched_buffer, size, limiter=self._warm_limiter,
                                                        abandon_on_cancel=True)
                finally:
                    self.resident -= size
                if size != max(self._largest.values(), default=0) or self.resident + self.pooled + size > self.limit:
                    return  # loads took the room meanwhile: they make their own
                self._free.append(buf)
                del buf  # a buffer the free list lets go of must not live on here
                self._notify()
        finally:
            self._warmed.set()

    @property
    def pooled(self) -> int:
        return sum(b.nbytes for b in self._free)

    # ------------------------------------------------------------------ eviction and buffers

    def _drop(self, slot: Slot) -> None:
        """Take ``slot`` out of the LRU; its buffer is recycled once no one uses it."""
        if slot.cached:
            del self._slots[slot.key]
            slot.cached = False
        if not slot.busy:
            self._recycle(slot)

    def _recycle(self, slot: Slot) -> None:
        """A slot no one can reach any more: its buffer joins the free list."""
        self.recycled(slot)
        buf, slot.buf, slot.data = slot.buf, None, None
        self.resident -= slot.nbytes
        slot.nbytes = 0
        if buf is not None:
            self._free.append(buf)
            self._trim_free()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _evict_for(self, need: int, unread_too: bool = True, idle_since: float | None = None) -> bool:
        """Evict windows nobody holds until ``need`` more bytes fit: least recently used first,
        windows already read before prefetched ones (those only if ``unread_too``), and at last
        windows that handles hold but nobody read since ``idle_since`` (if given), least recently
        read first."""
        for unread in (False, True) if unread_too else (False,):
            for slot in list(self._slots.values()):
                if self.resident + need <= self.limit:
                    return True
                if not slot.busy and slot.unread == unread:
                    self._drop(slot)
        if idle_since is not None:
            self.touched()
            for slot in sorted(self._idle_held(), key=lambda s: s.used):
                if self.resident + need <= self.limit:
                    return True
                if slot.used <= idle_since:
                    self._revoke(slot)
        return self.resident + need <= self.limit

    def _idle_held(self) -> list[Slot]:
        """Windows held by handles, loaded, no read copying from them."""
        return [s for s in self._slots.values() if s.holders and not s.pins and s.event.is_set()]

    def _revoke(self, slot: Slot) -> None:
        """Take a held window's memory: its handles see ``data`` None and load it again."""
        del self._slots[slot.key]
        slot.cached = False
        self._recycle(slot)
        self.revoked += 1

    def _trim_free(self) -> None:
        while self._free and self.resident + self.pooled > self.limit:
            self._free.pop(0)

    def _trim(self) -> None:
        """Back under the limit: free buffers go first, then windows nobody holds."""
        self._trim_free()
        if self.resident > self.limit:
            self._evict_for(0)
            self._trim_free()

    def _buffer(self, nbytes: int, preferred: int) -> np.ndarray | None:
        """A free buffer that holds ``nbytes`` without wasting more than half of itself, else
        None after making room for a new one of ``preferred`` bytes (the view's largest window,
        so any of its windows fits), which the loader thread maps."""
        fits = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= 2 * max(preferred, 1)]
        if fits:
            return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
        while self._free and self.resident + self.pooled + preferred > self.limit:
            self._free.pop(0)
        return None

    # ------------------------------------------------------------------ loading

    def _start(self, key: Hashable, nbytes: int, loader: Loader, work: int) -> Slot:
        if self.nursery is None:
            raise RuntimeError("WindowCache.nursery must be set before loading windows")
        owner = key[0]
        size = max(nbytes, self._largest.get(owner, nbytes))
        buf = self._buffer(nbytes, size)
        slot = Slot(key, owner, buf, size if buf is None else buf.nbytes, work)
        self.resident += slot.nbytes + work
        self._trim_free()
        self._slots[key] = slot
        self.loads += 1
        self._in_flight += 1
        self.nursery.start_soon(self._fill, slot, loader)
        return slot

    async def _fill(self, slot: Slot, loader: Loader) -> None:
        try:
            await self._fill_slot(slot, loader)
        finally:
            self.resident -= slot.work
            slot.work = 0
            self._in_flight -= 1
            self.landed += 1
            self._notify()

    async def _fill_slot(self, slot: Slot, loader: Loader) -> None:
        scratch = self._scratch.pop() if self._scratch else None
        buf, size = slot.buf, slot.nbytes

        def load() -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
            out = buf if buf is not None else new_buffer(size)
            return (out, *loader(out, scratch))

        try:
            # abandoned if cancelled (at unmount only), so that a load stuck on a hung source
            # does not hold up the exit; its buffer is then never reused
            # a remote source's loads wait for the network, not the CPU; but the first windows
            # of every file after an epoch change share the link a few at a time, so that the
            # one the first read wants (started first) is not slowed by all the others
            limiter = self.remote_limiter if slot.owner in self._ahead and not slot.background else self.limiter
            slot.buf, data, scratch = await trio.to_thread.run_sync(load, limiter=limiter, abandon_on_cancel=True)
        except BaseException as e:  # noqa: BLE001 -- handed to the waiters, never lost
            if isinstance(e, trio.Cancelled):
                slot.error = OSError("load cancelled at shutdown")
                slot.buf = None  # the abandoned thread may still write into it
            else:
                if not isinstance(e, (OSError, ShuffleError)):
                    log.error("loading window %s failed", slot.key, exc_info=e)
                # the traceback's frames hold the window buffer in a reference cycle (through
                # ``slot``): kept, it would stay allocated, uncounted, until a garbage collection
                slot.error = e.with_traceback(None)
            slot.event.set()
            self._drop(slot)
            if isinstance(e, trio.Cancelled):
                raise
            return
        if scratch is not None and self._largest and len(self._scratch) < self.limiter.total_tokens:
            self._scratch.append(scratch)
        slot.data = data
        slot.event.set()
        if not slot.cached:  # its view was closed meanwhile
            self._drop(slot)

    # ------------------------------------------------------------------ public

    def ahead_windows(self, owner: Hashable, window_bytes: int) -> int:
        """Windows of ``window_bytes`` a sequential reader of ``owner`` keeps loading ahead:
        `AHEAD`, or for a remote source enough for its measured bandwidth x latency."""
        ahead = self._ahead.get(owner)
        if ahead is None:
            return AHEAD
        return max(AHEAD, math.ceil(ahead.in_flight(time.monotonic()) / max(1, window_bytes)))

    def prefetch(self, key: Hashable, nbytes: int, loader: Loader, work: int = 0, background: bool = False) -> bool:
        """Start loading in the background if the window (and the load's ``work`` bytes) fits
        without evicting a busy one.  ``background``: for no reader yet (loads of remote sources
        then take turns with the CPU's few, instead of all sharing the link at once)."""
        if key in self._slots or self.nursery is None or key[0] not in self._largest or self._queue:
            return False  # (reads waiting for room come first)
        if not self._evict_for(max(nbytes, self._largest[key[0]]) + work, unread_too=False):
            if self._warmed.is_set():
                return False
            self.nursery.start_soon(self._prefetch_warmed, key, nbytes, loader, work, background)
            return True  # the buffer being faulted in is for this load: tried again once it is
        slot = self._start(key, nbytes, loader, work)
        slot.unread, slot.background = True, background
        self.prefetched += 1
        return True

    async def _prefetch_warmed(self, key: Hashable, nbytes: int, loader: Loader, work: int, background: bool) -> None:
        """A prefetch whose room a buffer being faulted in holds (an epoch change's window 0),
        tried again once it is free: dropped, the reader loaded that window itself."""
        await self._warmed.wait()
        self.prefetch(key, nbytes, loader, work, background)

    async def room(self, key: Hashable, nbytes: int, work: int = 0) -> None:
        """Before a read loads window ``key``: make room for it, waiting while it does not fit.

        Reads wait in line, first come first served: a read that finds others waiting queues
        behind them even if its window would fit now, and only the first in line takes memory
        as it is let go.  Without the line, a read that waited was overtaken again and again: 64
        readers of four 8.5 MB files of a ``--direct-io`` mount (4 MiB buffer, the epoch moved
        every 50 ms) got 100 reads ETIMEDOUT beside 900 whole reads; in line, 0 beside 1,171.

        Room comes from windows nobody holds, then from held windows unread for `HOLD_IDLE`
        seconds; otherwise the first read waits for loads to land and handles to move on.  Only
        if its turn has lasted `ROOM_WAIT` seconds does it load over the limit.  (When a read
        waited 2 s at most, then took the memory of windows others read, 32 readers of 32 epochs
        of a `full` view loaded at 1.4 times the memory bound, nearly every read a reload.)"""
        if key in self._slots:
            return
        size = max(nbytes, self._largest.get(key[0], nbytes)) + work
        if not self._queue and self._fits(size):
            return
        turn = trio.Event()
        self._queue.append(turn)
        try:
            if self._queue[0] is not turn:
                await turn.wait()  # set by the read before it in line when it leaves the line
            since = trio.current_time()
            while key not in self._slots:
                now = trio.current_time()
                if self._fits(size):
                    return  # fits (or never will: nothing left to wait for)
                if now - since >= ROOM_WAIT:
                    self.over_limit += 1
                    log.warning("a read waited %g s for memory and loads over the limit: %s", now - since,
                                self.pressure())
                    return
                wake = since + ROOM_WAIT
                held = [s.used for s in self._idle_held()]
                if held:
                    wake = min(wake, min(held) + HOLD_IDLE)
                with trio.move_on_at(wake):
                    await self._changed.wait()
        finally:
            first = self._queue[0] is turn
            self._queue.remove(turn)
            if first and self._queue:
                self._queue[0].set()

    def _fits(self, size: int) -> bool:
        """Whether ``size`` bytes fit now, evicting what may go (see `room`)."""
        return self._evict_for(size, idle_since=trio.current_time() - HOLD_IDLE) or self.resident == 0

    def pressure(self) -> str:
        """What holds the memory now, for the log line of a read that waited too long for it."""
        slots = list(self._slots.values())
        held = sum(1 for s in slots if s.holders)
        loading = sum(1 for s in slots if not s.event.is_set())
        copied = sum(1 for s in slots if s.pins and s.event.is_set() and not s.holders)
        largest = max(self._largest.values(), default=0)
        return (f"memory pressure: the windows' limit of {self.limit} bytes ({self.windows} windows of the largest "
                f"view in memory, {largest} bytes each) is taken by {len(slots)} windows and loads "
                f"({self.resident} bytes): {held} held by open handles reading them, {loading} loading, {copied} "
                f"being copied; {len(self._queue)} reads wait for memory (--buffer sets the window size)")

    def pin(self, key: Hashable, nbytes: int, loader: Loader, work: int = 0) -> Slot:
        """The window's slot, loading if absent; pinned (never evicted) until `release`."""
        slot = self._slots.get(key)
        if slot is None:
            # may stay over the limit: a read must be served
            self._evict_for(max(nbytes, self._largest.get(key[0], nbytes)) + work)
            slot = self._start(key, nbytes, loader, work)
        else:
            self._slots.move_to_end(key)
        slot.pins += 1
        slot.unread = False
        slot.used = trio.current_time()
        return slot

    @staticmethod
    async def wait(slot: Slot) -> np.ndarray:
        """The bytes of a pinned slot once loaded; raises the load's error (the pin stays)."""
        await slot.event.wait()
        if slot.error is not None:
            raise slot.error
        return slot.data

    async def acquire(self, key: Hashable, nbytes: int, loader: Loader, work: int = 0) -> Slot:
        """`room`, `pin` and `wait` in one: the ready window, pinned until `release`."""
        await self.room(key, nbytes, work)
        slot = self.pin(key, nbytes, loader, work)
        try:
            await self.wait(slot)
        except BaseException:
            self.release(slot)
            raise
        return slot

    def release(self, slot: Slot) -> None:
        slot.pins -= 1
        self._unused(slot)

    def hold(self, slot: Slot) -> None:
        """An open handle reads this window now: keep it until `unhold`."""
        slot.holders += 1
        slot.used = trio.current_time()

    def unhold(self, slot: Slot) -> None:
        slot.holders -= 1
        self._unused(slot)

    def _unused(self, slot: Slot) -> None:
        if self._queue:
            self._notify()
        if slot.busy:
            return
        if not slot.cached:
            self._recycle(slot)
        elif self.resident + self.pooled > self.limit:
            self._trim()

    def __contains__(self, key: Hashable) -> bool:
        """Whether window ``key`` is loaded or loading."""
        return key in self._slots

    def clear(self) -> None:
        for slot in list(self._slots.values()):
            self._drop(slot)
        self._free.clear()
        self._scratch.clear()

    def describe(self) -> dict[str, Any]:
        return {"windows": len(self._slots), "window_bytes": self.resident, "pooled_bytes": self.pooled,
                "limit_bytes": self.limit, "loads": self.loads, "prefetched": self.prefetched,
                "revoked": self.revoked, "over_limit": self.over_limit}
