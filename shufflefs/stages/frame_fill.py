"""A zstd file's background copy, filled with the frames its views decode anyway.

A file of many zstd frames whose index was cached and whose copy was not kept is read from its
frames (restart points) while a copy is made in the background.  Decoded by a child process of
its own, that copy cost a second decode of the whole file beside the views' own: on a 1.06 GiB
file in 1 MiB frames, the first epoch of a later mount read 0.64-0.67x the records/s of a
``zstandard`` line loop over the source.  Here every frame a view decodes (whole, its checksum
verified) is also written at its place in the copy, and the frame's other reads (the next
block's, or the first bytes a window needs of it for a record that runs into it) read it back
from the copy, so each frame is decoded once: 0.76-0.80x, against 0.83-0.87x with no copy made
at all, in runs one after the other (docs/benchmark.md).  The frames no view decodes (a rank
that reads a share of the file) are decoded by a child process once the views stop filling
(`IDLE` seconds without a new frame), and the copy is taken as made once every frame is in it.
Blocking, no FUSE.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Callable

import numpy as np

from ..errors import StageError
from ..index.decoded import Restarts
from ..index.table import SourceStamp
from ..scratch import pwrite_all

IDLE = 2.0
"""Seconds without a frame written by a view after which the child decodes the rest."""
POLL = 0.2
"""Seconds between the background thread's looks at the fill (and at the unmount)."""


class FrameFill:
    """The copy of one zstd file version (``restarts``, ``stamp``) being filled, at ``temp`` in
    ``directory``; `offer` and `read` are called by the views' decoders, any thread."""

    def __init__(self, directory: str, name: str, path: str, stamp: SourceStamp, restarts: Restarts) -> None:
        self.path, self.stamp, self.restarts = path, stamp, restarts
        self.temp = os.path.join(directory, f"part-{name}")
        self.fd = os.open(self.temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:  # its blocks at once: a full disk shows here, and writes cost less (0.19 against 0.27-0.79 CPU-s a GiB)
            if restarts.plain[-1] > 0:
                os.posix_fallocate(self.fd, 0, int(restarts.plain[-1]))
        except OSError:
            os.close(self.fd)
            os.unlink(self.temp)
            raise
        self.frames = restarts.points
        self._state = np.zeros(self.frames, np.uint8)  # 0 missing, 1 being written, 2 in the copy
        self._state[np.diff(restarts.plain) == 0] = 2  # empty frames: in it already
        self.written = int((self._state == 2).sum())
        self.error: OSError | None = None
        self._cond = threading.Condition()
        self._busy = 0  # writes and reads under way: the descriptor stays open for them
        self._closed = False

    def _enter(self) -> bool:
        with self._cond:
            if self._closed or self.error is not None:
                return False
            self._busy += 1
            return True

    def _leave(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    def has(self, i: int) -> bool:
        """Whether frame ``i`` is in the copy (read it with `read`)."""
        return self._state[i] == 2 and not self._closed

    def offer(self, i: int, data: memoryview) -> None:
        """Frame ``i`` decoded whole, checksum verified: written at its place unless it is already.
        A failed write ends the fill, never the view's read."""
        with self._cond:
            if self._state[i] or self._closed or self.error is not None:
                return
            self._state[i] = 1
            self._busy += 1
        try:
            pwrite_all(self.fd, data, int(self.restarts.plain[i]))
        except OSError as e:
            with self._cond:
                self.error, self._state[i] = e, 0
        else:
            with self._cond:
                self._state[i] = 2
                self.written += 1
        finally:
            self._leave()

    def read(self, i: int, at: int, out: memoryview) -> bool:
        """``out`` from decoded byte ``at`` of frame ``i``, read from the copy; False if it cannot
        be (the fill closed or failed): then decode it."""
        if not self.has(i) or not self._enter():
            return False
        try:
            start, done = int(self.restarts.plain[i]) + at, 0
            while done < len(out):
                n = os.preadv(self.fd, [out[done:]], start + done)
                if n <= 0:
                    return False
                done += n
            return True
        except OSError:
            return False
        finally:
            self._leave()

    def missing(self) -> np.ndarray:
        """The frames not in the copy (nor being written)."""
        with self._cond:
            return np.flatnonzero(self._state == 0)

    def mark(self, frames: np.ndarray) -> None:
        """``frames`` were written by the child."""
        with self._cond:
            fresh = self._state[frames] != 2
            self.written += int(fresh.sum())
            self._state[frames] = 2

    def complete(self, stopping: Callable[[], bool], low_on_room: Callable[[], str | None],
                 rest: Callable[[np.ndarray], bool], verify: Callable[[], None] = lambda: None) -> bool:
        """Wait for the views to fill the copy; once they stop (`IDLE`), ``rest(frames)`` decodes
        the frames still missing into `fd` (False: stopped).  True once every frame is in it,
        False if ``stopping`` turned true; `OSError` if a write failed or ``low_on_room`` says why
        the disk cannot take the rest; ``verify`` (the file is still the indexed version, else
        `StaleSourceError`) is asked at every look."""
        last, since = -1, time.monotonic()
        while True:
            if stopping():
                return False
            verify()
            if self.error is not None:
                raise self.error
            if self.written == self.frames:
                break
            why = low_on_room()
            if why is not None:
                raise OSError(errno.ENOSPC, why)
            if self.written != last:
                last, since = self.written, time.monotonic()
            elif time.monotonic() - since >= IDLE:
                frames = self.missing()
                with self._cond:
                    self._state[frames] = 1  # the child's now: views do not write them too
                if not rest(frames):
                    return False
                self.mark(frames)
                continue
            time.sleep(POLL)
        size = int(self.restarts.plain[-1])
        if os.fstat(self.fd).st_size != size:
            raise StageError(self.temp, None, f"the copy of {self.path} holds {os.fstat(self.fd).st_size} bytes, "
                             f"not {size}: changed by something else")
        return True

    def close(self, keep_as: str | None = None) -> None:
        """Stop filling and reading (waits for the writes and reads under way); the copy is renamed
        to ``keep_as``, else removed."""
        with self._cond:
            self._closed = True
            while self._busy:
                self._cond.wait()
        try:
            if keep_as is not None:
                os.rename(self.temp, keep_as)
            else:
                os.unlink(self.temp)
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)
