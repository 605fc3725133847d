"""The background half of `stages.decoded.Decoding`: copies queued at first open, made by one
low-priority thread one after another, once the disk has room for each.

A gzip file's copy is decoded by a child process (`copy_process`).  A zstd file of many frames
is copied from its views' own decoding (`frame_fill`): the frames they decode are written into
the copy and read back from it, and a child decodes only the frames no view decoded.  Blocking,
no FUSE.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import FormatError, ShuffleError, StaleSourceError
from ..formats.codecs import ZSTD
from ..index.decoded import Restarts
from ..index.table import SourceStamp
from ..sources.base import Source
from ..sources.decoded import close_kept_of
from .copy_process import decode_frames, decode_in_child
from .frame_fill import FrameFill
from .kept_copies import CopyDisk

log = logging.getLogger("shufflefs")

BACKGROUND_NICE = 10
"""Niceness of the thread making a background copy: the serving threads and the readers, which
the first epoch needs, come first."""


@contextmanager
def change_first(raw: Source) -> Iterator[None]:
    """A decode error of a file that changed while it was decoded is that change
    (`StaleSourceError` from ``raw.verify_open``), not a damaged stream."""
    try:
        yield
    except FormatError:
        raw.verify_open()
        raise


class Stopped(Exception):
    """A background copy stopped by the unmount."""


class Copy:
    """One file version's decoded copy and the views reading it."""

    def __init__(self, path: str, stamp: SourceStamp, seconds: float, made: str) -> None:
        self.path, self.stamp, self.seconds, self.made, self.users = path, stamp, seconds, made, 0


class BackgroundCopies:
    """Background copies (module docstring), for `Decoding`, whose state they share."""

    store: Any
    disk: CopyDisk
    _lock: threading.Lock
    _closing: bool
    _tried: set
    _making: dict[str, str]
    _queue: list[tuple]
    _worker: threading.Thread | None
    _refused: dict[str, str]
    _building: dict[str, threading.Lock]
    _copies: dict[str, Copy]
    _fills: dict[str, FrameFill]
    _build: Callable[..., Copy]
    _made_now: Callable[[str, Copy], Copy]
    _directory: Callable[[], str]

    def room_for(self, size: int) -> str | None:
        """Why a background copy of ``size`` bytes may not be made now (`CopyDisk.room_for`)."""
        return self.disk.room_for(size)

    def _start(self, relpath: str, path: str, stamp: SourceStamp, restarts: Restarts) -> None:
        """Queue the background copy of this version of ``path`` unless one was.  One thread makes
        the queued copies one after another (a pool of a thousand shards opened at once is not a
        thousand decoders), each once the disk has room for it (else why is kept for
        `describe_view`)."""
        with self._lock:
            if self._closing or (path, stamp) in self._tried:  # (another version's may be under way: it fails)
                return
            self._tried.add((path, stamp))
            self._making[path] = "queued"
            self._queue.append((relpath, path, stamp, restarts))
            if self._worker is not None:
                return
            self._worker = threading.Thread(target=self._drain, name="decoded-copy", daemon=True)
            worker = self._worker
        worker.start()

    def _drain(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError:
            pass
        while True:
            with self._lock:
                if self._closing or not self._queue:
                    self._worker = None
                    for _, path, _, _ in self._queue:
                        self._making.pop(path, None)
                    self._queue.clear()
                    return
                relpath, path, stamp, restarts = self._queue.pop(0)
            refused = self.room_for(int(restarts.plain[-1]))
            with self._lock:
                if refused is not None:
                    self._refused[path] = refused
                    self._making.pop(path, None)
                else:
                    self._refused.pop(path, None)
                    self._making[path] = "being made"
            if refused is not None:
                log.info("%s: no decoded copy: %s; its views decode from restart points", path, refused)
            else:
                try:
                    self._background(relpath, path, stamp, restarts)
                except Exception:  # not the next copies' end too
                    log.exception("%s: the background copy failed; its views decode from restart points", path)

    def _background(self, relpath: str, path: str, stamp: SourceStamp, restarts: Restarts) -> None:
        try:
            packed = getattr(self.store, "open_packed", None)
            raw = packed(relpath, stamp) if packed is not None else self.store.open(relpath, stamp)
            try:
                with self._lock:
                    building = self._building.setdefault(path, threading.Lock())
                with building:
                    if restarts.codec == ZSTD:
                        self._filled(path, stamp, restarts, raw)
                    else:
                        self._build(path, stamp, restarts, raw, "made in the background", background=True)
            finally:
                raw.close()
            close_kept_of(path)  # the next views read the copy: their decoders' memory is free again
        except Stopped:
            pass
        except StaleSourceError as e:  # a new version has a copy of its own, made once it is opened
            log.info("%s: no decoded copy of the version first opened (%s)", path, e)
        except (OSError, ShuffleError) as e:
            log.warning("%s: no decoded copy (%s): its views decode from restart points", path, e)
            with self._lock:
                self._refused[path] = str(e)
        finally:
            with self._lock:
                if any(q[1] == path for q in self._queue):
                    self._making[path] = "queued"  # its next version
                else:
                    self._making.pop(path, None)

    def _fill_of(self, path: str, stamp: SourceStamp) -> FrameFill | None:
        got = self._fills.get(path)
        return got if got is not None and got.stamp == stamp else None

    def _filled(self, path: str, stamp: SourceStamp, restarts: Restarts, raw: Source) -> Copy:
        """A zstd file's background copy, filled by the frames its views decode and the rest by a
        child process (`frame_fill`); stops at unmount."""
        directory = self._directory()
        name = f"{len(self._copies)}-{stamp.ino}-{stamp.mtime_ns}"
        fill, kept, t0 = FrameFill(directory, name, path, stamp, restarts), None, time.monotonic()
        fd, stopping = getattr(raw, "fd", -1), lambda: self._closing  # noqa: E731

        def rest(frames: np.ndarray) -> bool:
            table = np.stack([restarts.packed[frames], restarts.packed_end[frames], restarts.plain[frames],
                              restarts.plain[frames + 1]], axis=1)
            log.info("%s: %d of %d frames of its copy decoded %s (its views filled the rest)", path,
                     len(frames), fill.frames, "by a child" if fd >= 0 else "here")
            with change_first(raw):
                if fd >= 0:
                    got = decode_in_child(fd, stamp.size, ZSTD, fill.fd, directory, path, BACKGROUND_NICE, stopping, table)
                else:  # an object's copy: no local descriptor
                    got = decode_frames(raw.read_range, table, fill.fd, path, stopping)
            return got is not None

        with self._lock:
            self._fills[path] = fill
        try:
            if not fill.complete(stopping, lambda: self._low_on_room(), rest, raw.verify_open):
                raise Stopped
            raw.verify_open()  # decoded from the indexed version to its end
            kept = os.path.join(directory, name)
        finally:
            with self._lock:
                self._fills.pop(path, None)
            fill.close(kept)
        seconds = time.monotonic() - t0
        log.info("%s: decoded copy of %d bytes in %s, filled by its views' decoding (%.1f s)", path,
                 int(restarts.plain[-1]), kept, seconds)
        return self._made_now(path, Copy(kept, stamp, seconds, "in the background, from its views' decoding"))

    def _low_on_room(self) -> str | None:
        where, free, keep = self.disk.free_space()
        return None if free is None or free > keep else f"{where} has {free:,} free bytes, copies leave {keep:,}"
