"""A window's place in the cache (`Slot`) and its buffer; what a remote source tells the cache
about its link (`Readahead`)."""

from __future__ import annotations

from typing import Hashable, Protocol

import numpy as np
import trio


def new_buffer(nbytes: int) -> np.ndarray:
    """A new window buffer (numpy asks for transparent huge pages; see the module docstring)."""
    return np.empty(nbytes, np.uint8)


def touched_buffer(nbytes: int) -> np.ndarray:
    """A new window buffer with every page already faulted in (blocking: for a worker thread)."""
    buf = new_buffer(nbytes)
    buf[::4096] = 0
    return buf


class Slot:
    """One window of one view: loading, then ready (``data``) or failed (``error``)."""

    __slots__ = ("key", "owner", "nbytes", "work", "event", "data", "buf", "error", "pins", "holders", "cached",
                 "unread", "used", "background")

    def __init__(self, key: Hashable, owner: Hashable, buf: np.ndarray | None, nbytes: int, work: int = 0) -> None:
        self.key = key
        self.owner = owner
        self.buf = buf  # the allocation behind ``data`` (None until the loader made a new one)
        self.nbytes = nbytes  # charged to the limit until recycled
        self.work = work  # the load's working memory, charged to the limit while it runs
        self.event = trio.Event()
        self.data: np.ndarray | None = None
        self.error: BaseException | None = None
        self.pins = 0  # reads copying from it right now
        self.holders = 0  # open handles whose current window it is
        self.cached = True  # in the LRU (findable); False once evicted or dropped
        self.unread = False  # prefetched and not read yet
        self.used = 0.0  # trio time of its last read (set by readers of a held window too)
        self.background = False  # loaded for no reader yet (an epoch change's first windows)

    @property
    def busy(self) -> bool:
        """Not evictable: loading, pinned by a read, or held by a handle."""
        return self.pins > 0 or self.holders > 0 or not self.event.is_set()


class Readahead(Protocol):
    """A remote source's measure of the bytes to keep loading ahead of a sequential reader
    (`sources.link.LinkMeter`): at most ``cap``."""

    cap: int

    def in_flight(self, now: float) -> int: ...
