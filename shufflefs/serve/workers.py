"""Worker threads: everything that touches the source or gathers records runs off the trio
thread, in capacity-limited pools so that one kind of work cannot starve another.

Every call has a deadline.  A call on a hung source (a dead network filesystem) cannot be
interrupted, but the request waiting for it can: past its deadline it gets ``ETIMEDOUT`` and its
place in the pool is given back, so that a few stuck calls never leave every later request
queueing behind them.  The stuck thread itself runs on (counted in `stuck`, at most `STUCK`);
when it returns at last, its result is dropped."""

from __future__ import annotations

import errno
import logging
import math
import threading
from typing import Any, Callable

import trio

log = logging.getLogger("shufflefs")

META_DEADLINE = 15.0
"""Seconds a stat, listing, open or pass-through read may take (a local one takes microseconds;
a remote store's calls get their own retries' worth on top, see `Workers`)."""
BUILD_DEADLINE = 1800.0
"""Seconds an index build, plan or view may take: a scan reads the whole file (about 1 TB at
the disk speeds seen here), so this only ends builds that make no progress at all."""
WINDOW_DEADLINE = 60.0
"""Seconds a read may wait for its window (a load of a few windows' worth of reads, queued
behind other readers' loads; a remote store's retries take longer, see `Workers`)."""
STUCK = 256
"""Threads left running past their deadline before new calls are refused outright (each is a
thread blocked in the kernel, costing a stack and nothing else)."""


class Timeout(OSError):
    """A call of the daemon on the source got no answer within its deadline."""

    def __init__(self, what: str, deadline: float) -> None:
        super().__init__(errno.ETIMEDOUT, f"no answer from the source within {deadline:g} s ({what})")


class Workers:
    """``meta``: stats, listings and opens; ``index``: index builds, layouts, views; ``plan``:
    plans, one at a time (a record-level plan's build takes several times its size for a moment,
    ``window``: 20 bytes per record; two at once under epoch churn peaked at 1.09 of the memory
    bound).

    ``meta_deadline``: the deadline of calls in ``meta`` (and of calls in other limiters given
    none); builds get `BUILD_DEADLINE`."""

    def __init__(self, meta_deadline: float = META_DEADLINE) -> None:
        self.meta = trio.CapacityLimiter(8)
        self.index = trio.CapacityLimiter(2)
        self.plan = trio.CapacityLimiter(1)
        self.meta_deadline = meta_deadline
        self.window_deadline = max(WINDOW_DEADLINE, 2 * meta_deadline)
        # threads: the pools' tokens are held by the waiting request, the thread holds one of
        # these until it returns, even past its deadline
        self._threads = trio.CapacityLimiter(STUCK + 16)
        self.stuck = 0
        """Calls past their deadline whose threads still run."""
        self.timeouts = 0

    def deadline_of(self, limiter: trio.CapacityLimiter) -> float:
        return BUILD_DEADLINE if limiter is self.index or limiter is self.plan else self.meta_deadline

    async def run(self, fn: Callable, *args: Any, limiter: trio.CapacityLimiter | None = None,
                  deadline: float | None = None) -> Any:
        """``fn(*args)`` on a thread of ``limiter`` (default `meta`); `Timeout` past ``deadline``
        (default `deadline_of` the limiter; ``math.inf``: none)."""
        limiter = limiter or self.meta
        deadline = self.deadline_of(limiter) if deadline is None else deadline
        name = getattr(fn, "__qualname__", None) or getattr(getattr(fn, "func", None), "__qualname__", "call")
        if self.stuck >= STUCK:
            self.timeouts += 1
            raise Timeout(f"{name}: {self.stuck} earlier calls are still stuck", deadline)
        call = _Call(self, fn, args)
        with trio.move_on_after(deadline if math.isfinite(deadline) else math.inf) as scope:
            async with limiter:
                # abandoned when cancelled (the deadline, or unmount): the request goes on
                return await trio.to_thread.run_sync(call.run, limiter=self._threads, abandon_on_cancel=True)
        assert scope.cancelled_caught
        self.timeouts += 1
        call.abandon()
        log.error("%s(%s) got no answer within %g s (is the source hung?): the request gets ETIMEDOUT",
                  name, ", ".join(repr(a) for a in args if isinstance(a, (str, int)))[:200], deadline)
        raise Timeout(name, deadline)


class _Call:
    """One call's thread, which may outlive the request that made it (then counted as stuck)."""

    def __init__(self, workers: Workers, fn: Callable, args: tuple) -> None:
        self.workers, self.fn, self.args = workers, fn, args
        self.lock = threading.Lock()
        self.started = self.done = self.late = False

    def run(self) -> Any:
        with self.lock:
            self.started = True
        try:
            return self.fn(*self.args)
        finally:
            with self.lock:
                self.done = True
                if self.late:
                    self.workers.stuck -= 1

    def abandon(self) -> None:
        with self.lock:
            if self.started and not self.done:  # (one that never got a thread costs nothing)
                self.late = True
                self.workers.stuck += 1
