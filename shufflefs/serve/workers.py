"""Worker threads: everything that touches the source or gathers records runs off the trio
thread, in capacity-limited pools so that one kind of work cannot starve another."""

from __future__ import annotations

import functools
from typing import Any, Callable

import trio


class Workers:
    """``meta``: stats, listings and opens; ``index``: index builds, layouts, views; ``plan``:
    plans, one at a time (a record-level plan's build takes several times its size for a moment,
    ``window``: 20 bytes per record; two at once under epoch churn peaked at 1.09 of the memory
    bound)."""

    def __init__(self) -> None:
        self.meta = trio.CapacityLimiter(8)
        self.index = trio.CapacityLimiter(2)
        self.plan = trio.CapacityLimiter(1)

    async def run(self, fn: Callable, *args: Any, limiter: trio.CapacityLimiter | None = None) -> Any:
        # abandoned when cancelled (only at unmount): a call stuck on a hung source must not
        # hold up the exit; its result is dropped
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter or self.meta,
                                             abandon_on_cancel=True)
