"""One computation per key at a time, shared by everyone who asks meanwhile (trio)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Hashable

import trio


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
