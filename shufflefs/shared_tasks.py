"""One computation per key at a time, shared by everyone who asks meanwhile (trio)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Hashable, Iterable

import trio


async def each(fns: Iterable[Callable[[], Awaitable[Any]]]) -> None:
    """Run ``fns`` at once; the first to fail ends the others, and its error is raised as it is.
    A nursery raises an `ExceptionGroup`, which the FUSE operations' handlers took for an internal
    error: a pool member that was not a Parquet file logged a traceback instead of its reason."""
    try:
        async with trio.open_nursery() as nursery:
            for fn in fns:
                nursery.start_soon(fn)
    except BaseExceptionGroup as group:
        raise _first(group) from None


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first failure in ``group`` (nested groups looked into), a cancellation only if alone."""
    flat: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        e = todo.pop(0)
        if isinstance(e, BaseExceptionGroup):
            todo[:0] = list(e.exceptions)
        else:
            flat.append(e)
    return next((e for e in flat if not isinstance(e, trio.Cancelled)), flat[0])


class SharedTasks:
    """Run one computation per key at a time; concurrent callers await the same result.

    Used so that the index of a file is built once even when many processes open it at once.
    Results are not kept here (callers cache what they want); failures reach every waiter.
    """

    def __init__(self) -> None:
        self._running: dict[Hashable, tuple[trio.Event, list]] = {}

    def running(self, key: Hashable) -> bool:
        return key in self._running

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
