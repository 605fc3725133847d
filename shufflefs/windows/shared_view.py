"""A view shared by the loads running on worker threads: its source stays open until the last
load that uses it ends, however early the view is closed."""

from __future__ import annotations

import errno
import threading

import numpy as np

from ..strategies import Plan
from .view import View


class ViewClosed(OSError):
    """A load asked of a view that is closing (a shard's view closed while its stream is read)."""

    def __init__(self) -> None:
        super().__init__(errno.EBADF, "view closed")


class SharedView:
    """A `View` whose source is closed only once no worker thread is loading from it."""

    def __init__(self, view: View) -> None:
        self.view = view
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False

    def load(self, k: int, out: np.ndarray | None, scratch: np.ndarray | None,
             ahead: bool = False, plan: Plan | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        with self._lock:
            if self._closing:
                raise ViewClosed()
            self._users += 1
        try:
            return self.view.load_window(k, out, scratch, ahead, plan)
        finally:
            with self._lock:
                self._users -= 1
                if self._closing and self._users == 0:
                    self.view.close()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            if self._users == 0:
                self.view.close()
