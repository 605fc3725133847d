"""Which handles' windows the compiled replies answer reads from (`shufflefs.replies`).

A read Python serves from a handle's held window offers that window: later reads inside it are
answered by the compiled replies without entering Python.  A window is withdrawn before anything
can take its bytes away: when its handle leaves it, and when the window cache recycles its
buffer (`WindowCache.recycled`).  Reads answered there are folded back into the handle's history
(`Handle.continues`) before Python serves its next read, and into the window's last use before
the cache looks for idle windows (`WindowCache.touched`), so read-ahead and eviction see them.
Only sources whose per-read check is a few ``fstat`` calls (`Source.open_checks`) are offered:
the compiled replies make the same check before every reply.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import trio

from .. import replies
from ..windows.cache import Slot
from .nodes import Handle

log = logging.getLogger("shufflefs")

REPLY_THREADS = 2
"""Reply threads of ``--reply-threads auto``, at most one per CPU the daemon may use."""


def reply_threads() -> int:
    """``--reply-threads auto``: `REPLY_THREADS`, fewer on a machine with fewer CPUs."""
    return min(REPLY_THREADS, len(os.sched_getaffinity(0)))


class Replies:
    def __init__(self, enabled: bool, threads: int | None = None) -> None:
        self.lib = replies.compiled if enabled and replies.bound else None
        self.threads = reply_threads() if threads is None else threads
        if self.lib is not None and self.threads and not self.lib.stats()["threads"]:
            self.lib.start(self.threads)
        self._held: dict[int, set[Handle]] = {}  # id(slot) -> handles whose offer of it stands

    def close(self) -> None:
        """Write what is queued and end the reply threads (every handle was released)."""
        if self.lib is not None:
            self.lib.stop()

    def offer(self, h: Handle, plain: int = -1) -> None:
        """``h`` read its held window: let the compiled replies answer its next reads inside it
        (``plain``: the size of the plain view a zstd view frames, whose window it is)."""
        slot = h.slot
        if self.lib is None or h.fh is None or slot is None or slot.data is None or h.offered is slot:
            return
        ask = getattr(h.node.view.view.source, "open_checks", None)
        checks = ask() if ask is not None else None
        if checks is None:
            return
        self.withdraw(h)
        try:
            ok = self.lib.register(h.fh, h.lo, h.hi, slot.data, h.shift, checks, plain)
        except ValueError as e:  # a window that does not cover its range: Python serves it
            log.debug("window of %s not offered: %s", h.node.relpath, e)
            return
        if ok:
            h.offered = slot
            self._held.setdefault(id(slot), set()).add(h)

    def withdraw(self, h: Handle) -> None:
        """No more compiled replies for ``h`` (it leaves its window, or is closed)."""
        if h.offered is None:
            return
        self._fold(h, self.lib.unregister(h.fh))
        held = self._held.get(id(h.offered))
        if held is not None:
            held.discard(h)
            if not held:
                del self._held[id(h.offered)]
        h.offered = None

    def withdraw_node(self, node: object) -> None:
        """Every offer of ``node``'s handles (its source was found changed or gone)."""
        for held in list(self._held.values()):
            for h in [h for h in held if h.node is node]:
                self.withdraw(h)

    def recycled(self, slot: Slot) -> None:
        """``slot``'s buffer is about to be reused or dropped: withdraw every offer of it."""
        for h in list(self._held.get(id(slot), ())):
            self.withdraw(h)

    def sync(self, h: Handle) -> None:
        """Before Python serves ``h``: note the reads answered for it since."""
        if h.offered is not None:
            self._fold(h, self.lib.take(h.fh))

    def touch(self) -> None:
        """Windows read through compiled replies are in use: their last use moves up."""
        for held in list(self._held.values()):
            for h in list(held):
                self._fold(h, self.lib.take(h.fh))

    @staticmethod
    def _fold(h: Handle, taken: Any) -> None:
        if not taken or not taken[0]:
            return
        _, last_end, last_ns = taken
        h.noted(last_end)
        if h.offered is None:
            return
        try:
            now = trio.current_time()
        except RuntimeError:  # released at shutdown, after the loop ended: no window is reused now
            return
        h.offered.used = max(h.offered.used, now - (time.monotonic_ns() - last_ns) / 1e9)  # -> trio's clock

    def describe(self) -> dict[str, Any]:
        if replies.compiled is None:
            return {"state": "not built"}
        state = "off" if self.lib is None and replies.bound else "on" if self.lib is not None else "unbound"
        return {"state": state, **replies.compiled.stats()}
