"""Opening the sources of compressed files, and their decoded copies on node-local disk.

`Decoding.open` is how the mount opens any file it serves a view of: a plain file is its store's
`Source`; a compressed one (`Format.codec`) is a `sources.decoded.DecodedSource` over it, which
decodes runs from the file's restart points, or reads a decoded *copy* of it when it has none
worth using (one zstd frame: `index.decoded.DecodedIndex.staged`) or when the mount's order reads
record by record (`RESTART_ORDERS`: a record-level order would decode a restart interval per
record).  A copy is made once per file version, on first open, by decoding the whole file (its
checksums verified) into a directory of its own under ``--stage-dir``, else under the cache
directory (node-local disk, where indexes are; the temporary directory is often memory), held
like a stage directory (`scratch.held`: a killed mount's is removed by the next one there).
Copies stay while the mount runs, one per file: a new version's copy replaces the old one once
no view reads it.  At unmount they are kept for the next mount of that directory
(`kept_copies`), which reads a file's kept copy if its version is the same.  Blocking (worker
threads), no FUSE.

Under ``--decoded-copies auto`` (the default) every file gets a copy when the disk keeps room
besides it: written by the scan that indexes it (`index`: the scan decodes it all anyway), else
(its index cached) queued at its first open and made by one low-priority thread, one copy after
another, while the first views decode (`background_copies`: a gzip file's decoded by a child
process, a zstd file's filled with the frames its views decode).  Views opened once it is there
read it and decode nothing.  Where the bytes come from never changes which bytes a view holds.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

from .. import scratch
from ..errors import StageError, StaleSourceError
from ..formats import Format
from ..formats.compressed import CopyTarget
from ..index.decoded import DecodedIndex, Restarts
from ..index.table import SourceStamp, write_atomically
from ..sources.base import Source, Store
from ..sources.decoded import DecodedSource, close_kept
from ..sources.local import SourceFile
from ..windows.container import served_size
from .background_copies import BACKGROUND_NICE, BackgroundCopies, Copy, Stopped, change_first
from .copy_process import decode_in_child, decode_into
from .frame_fill import FrameFill
from .kept_copies import CopyDisk

__all__ = ["Decoding", "RESTART_ORDERS", "served_size"]  # served_size: a compressed view's size

log = logging.getLogger("shufflefs")

COPY_PREFIX = "decoded-"
RESTART_ORDERS = frozenset({"none", "block", "corgipile", "stratified"})
"""Orders that read whole blocks, which are decoded from restart points; any other reads a
compressed file's records from a decoded copy."""
DECODED_COPY_MODES = ("auto", "needed")
"""``--decoded-copies``: ``auto`` copies every compressed file when the disk has room, ``needed``
only those without restart points worth using or under a record-level order."""
RESTARTS_KEPT = 32 << 20
"""Bytes of restart points (mostly gzip's index: ~5 MB per GiB decoded) kept for the next opens
of their files (a pool's members, every epoch)."""


class Decoding(BackgroundCopies):
    """The mount's opener of view sources (module docstring); ``root``: where copies go,
    ``strategy``: the mount's order."""

    def __init__(self, store: Store, cache_dir: str | os.PathLike, root: str | os.PathLike, strategy: str,
                 copies: str = "auto") -> None:
        if copies not in DECODED_COPY_MODES:
            raise ValueError(f"decoded copies must be one of {', '.join(DECODED_COPY_MODES)}: {copies!r}")
        self.store, self.cache_dir, self.root = store, cache_dir, os.fspath(root)
        self.copy_all = strategy not in RESTART_ORDERS
        self.background = copies == "auto" and not self.copy_all
        self._closing = False
        self._tried: set[tuple[str, SourceStamp]] = set()  # versions a background copy was started (or refused) for
        self._looked: set[tuple[str, SourceStamp]] = set()  # versions a kept copy was looked for
        self._making: dict[str, str] = {}  # background copies queued or being made, by source path
        self._queue: list[tuple] = []  # (relpath, path, stamp, restarts) of the copies queued
        self._worker: threading.Thread | None = None  # the thread making them
        self._refused: dict[str, str] = {}  # why a file has no background copy
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._copies: dict[str, Copy] = {}  # by source path
        self._fills: dict[str, FrameFill] = {}  # zstd copies being filled by the views' decoding, by source path
        self._restarts: dict[tuple, Restarts] = {}
        self._dir: str | None = None
        self._hold = -1
        self._numbers = itertools.count()
        self.disk = CopyDisk(self.root)
        self.kept = self.disk.kept

    def open(self, relpath: str, stamp: SourceStamp, fmt: Format | None, index: Any = None,
             light: bool = False) -> Source:
        """The source of a view of ``relpath`` at version ``stamp``.  ``index``: the file's index if
        at hand (else the cached one is loaded); ``light``: only a few reads near restart points
        follow (a header, the last byte), so no copy is made for them (a copy made is read)."""
        if fmt is None or fmt.codec is None:
            return self.store.open(relpath, stamp)
        restarts = self._restarts_of(relpath, stamp, fmt, index)
        packed = getattr(self.store, "open_packed", None)  # an object: its copy on local disk (`sources.packed`)
        raw = packed(relpath, stamp) if packed is not None else self.store.open(relpath, stamp)
        path = self.store.path(relpath)
        try:
            made = self._made(path, stamp, int(restarts.plain[-1]))  # a copy: no decoder at all
            if made is not None:
                return DecodedSource(raw, restarts, stamp.size, path, *made)
            if (not restarts.usable or self.copy_all) and not light:
                copy, release = self._copy(path, stamp, restarts, raw)
                return DecodedSource(raw, restarts, stamp.size, path, copy, release)
            if self.background and not light:
                self._start(relpath, path, stamp, restarts)
            return DecodedSource(raw, restarts, stamp.size, path, fill=lambda: self._fill_of(path, stamp))
        except BaseException:
            raw.close()
            raise

    def opener(self, fmt: Format | None) -> Callable[[str, SourceStamp], Source]:
        """``open`` of a pool's members (`sources.pool.PoolSource`)."""
        return lambda relpath, stamp: self.open(relpath, stamp, fmt)

    def _restarts_of(self, relpath: str, stamp: SourceStamp, fmt: Format, index: Any) -> Restarts:
        key = (relpath, stamp, fmt.name)
        if isinstance(index, DecodedIndex) and index.stamp == stamp:
            restarts = index.restarts
        else:
            with self._lock:
                restarts = self._restarts.get(key)
            if restarts is None:
                index = self.store.index(relpath, fmt, self.cache_dir)  # the cached index, or a scan
                if index.stamp != stamp or not isinstance(index, DecodedIndex):
                    raise StaleSourceError(self.store.path(relpath), None, "source changed since it was looked up")
                restarts = index.restarts
        with self._lock:
            self._restarts.pop(key, None)
            self._restarts[key] = restarts  # the most recent last
            while len(self._restarts) > 1 and sum(len(r.blob) + 24 * len(r.plain)
                                                  for r in self._restarts.values()) > RESTARTS_KEPT:
                self._restarts.pop(next(iter(self._restarts)))
        return restarts

    def describe_view(self, index: Any, path: str | None = None) -> dict[str, Any]:
        """What ``user.shufflefs.info`` says of a compressed view whose (file's) index is ``index``
        (of the file at ``path``, whose background copy it tells)."""
        restarts = getattr(index, "restarts", None)
        if restarts is None:  # a pool's: its members' points are their own
            return {"read_from": "decoded copies" if self.copy_all else "restart points or decoded copies"}
        copied = self.copy_all or not restarts.usable
        why = ("its order reads record by record" if self.copy_all else
               "it has no restart points worth decoding from (one zstd frame)") if copied else ""
        more: dict[str, Any] = {}
        if not copied and self.background and path is not None:
            with self._lock:
                got, making, refused = self._copies.get(path), self._making.get(path), self._refused.get(path)
            if got is not None and got.stamp == index.stamp:
                copied, why = True, f"--decoded-copies auto: made {got.made}, so views decode nothing"
            elif making:
                more["decoded_copy"] = f"{making} in the background (--decoded-copies auto)"
            elif refused:
                more["decoded_copy"] = f"none: {refused}"
        return {"codec": restarts.codec, "restart_points": restarts.points, "decoded_bytes": int(restarts.plain[-1]),
                "read_from": "a decoded copy" if copied else "restart points", **({"copied_because": why} if why else {}),
                **({"copy_dir": self._dir or self.root} if copied else {}), **more}

    # ------------------------------------------------------------------ copies made by index scans

    def index(self, relpath: str, fmt: Format, cache_dir: str | os.PathLike) -> Any:
        """The store's index of ``relpath`` (cached in ``cache_dir``, the mount's index cache as
        it is now: another one if it turned out read-only); a compressed file's scan also writes
        its copy."""
        copy = self.copy_target(relpath, fmt)
        if copy is None:
            return self.store.index(relpath, fmt, cache_dir)
        t0 = time.monotonic()
        try:
            index = self.store.index(relpath, fmt, cache_dir, copy=copy)  # type: ignore[call-arg]
        except BaseException:
            self._remove(copy)
            raise
        self.adopt(relpath, index, copy, time.monotonic() - t0)
        return index

    def copy_target(self, relpath: str, fmt: Format | None) -> CopyTarget | None:
        """Where the scan of a compressed file that indexes it writes its copy, if this mount
        copies the file (`background` or `copy_all`) and the store's scans can: the copy then
        costs no second decode, and the file's first views read it.  The writing stops short of
        the free space copies leave (`CopyWriter`)."""
        if (fmt is None or fmt.codec is None or not (self.background or self.copy_all) or self._closing
                or not getattr(self.store, "copies_while_indexing", False)):
            return None
        self.kept.trim()
        _, free, keep = self.disk.free_space()
        if free is None or free <= keep:
            return None
        try:
            where = self._directory()
        except OSError as e:  # (a read-only cache directory): views decode, or copy at first open
            log.info("%s: no decoded copy while indexing: %s", relpath, e)
            return None
        return CopyTarget(os.path.join(where, f"indexed-{next(self._numbers)}"), keep)

    def adopt(self, relpath: str, index: Any, target: CopyTarget, seconds: float) -> None:
        """Take the copy a scan wrote to ``target`` as the copy of ``index``'s version, if the scan
        wrote it whole (else, or if it wrote none, as when the index was cached, nothing)."""
        size = int(index.restarts.plain[-1]) if getattr(index, "restarts", None) is not None else -1
        try:
            written = os.path.getsize(target.path)
        except OSError:
            return
        path = self.store.path(relpath)
        with self._lock:
            taken = written == size and index.stamp is not None and not self._closing and path not in self._making
            if taken:
                old = self._copies.get(path)
                self._copies[path] = Copy(target.path, index.stamp, seconds, "by the scan that indexed the file")
                self._tried.add((path, index.stamp))
        if not taken:
            self._remove(target)
            return
        log.info("%s: decoded copy of %d bytes written by its index scan (%.1f s) in %s", path, size, seconds,
                 target.path)
        if old is not None and old.users == 0:
            self._remove(old)

    def _made(self, path: str, stamp: SourceStamp, size: int) -> tuple[Source, Callable[[], None]] | None:
        """The copy of ``path`` at version ``stamp`` as a source and its release, if made."""
        with self._lock:
            got = self._copies.get(path)
        if got is None or got.stamp != stamp:
            got = self._take_kept(path, stamp, size)
            if got is None:
                return None
        try:
            return self._use(path, got, size)
        except (OSError, StaleSourceError, StageError) as e:
            log.warning("%s: its decoded copy cannot be read (%s): read from restart points", path, e)
            return None

    def _take_kept(self, path: str, stamp: SourceStamp, size: int) -> Copy | None:
        """The copy of this version of ``path`` an earlier mount kept (`kept_copies`), taken as
        this mount's, if there is one (looked for once per version)."""
        with self._lock:
            if self._closing or (path, stamp) in self._looked:
                return None
            self._looked.add((path, stamp))
        try:
            target = os.path.join(self._directory(), f"kept-{next(self._numbers)}")
        except OSError:
            return None
        if self.kept.take(path, stamp, size, target) is None:
            return None
        log.info("%s: read from the decoded copy an earlier mount kept, now %s", path, target)
        got = Copy(target, stamp, 0.0, f"by an earlier mount, kept in {self.kept.dir}")
        with self._lock:
            old = self._copies.get(path)
            if old is not None and old.stamp == stamp:  # made meanwhile
                got, old = old, got
            else:
                self._copies[path] = got
                self._tried.add((path, stamp))
        if old is not None and old.users == 0:
            self._remove(old)
        return got

    # ------------------------------------------------------------------ copies

    def _copy(self, path: str, stamp: SourceStamp, restarts: Restarts, raw: Source
              ) -> tuple[Source, Callable[[], None]]:
        """The decoded copy of ``path`` at version ``stamp`` (made now if there is none) as a
        source, and its release."""
        with self._lock:
            building = self._building.setdefault(path, threading.Lock())
        with building:  # one build per file at a time; opens of it wait for it
            with self._lock:
                got = self._copies.get(path)
            size = int(restarts.plain[-1])
            if got is None or got.stamp != stamp:
                if got is not None and got.users == 0:
                    self._drop(path, got)
                got = self._build(path, stamp, restarts, raw, "no restart points worth decoding from"
                                  if not restarts.usable else "read record by record")
            return self._use(path, got, size)

    def _use(self, path: str, got: Copy, size: int) -> tuple[Source, Callable[[], None]]:
        """Copy ``got`` of ``path`` opened as a source, and its release."""
        try:
            source = SourceFile(got.path, SourceStamp.of(os.stat(got.path)))
            if source.stamp.size != size:
                source.close()
                raise StageError(got.path, None, f"decoded copy of {path} holds {source.stamp.size} bytes, "
                                 f"not {size}: changed by something else")
        except (OSError, StaleSourceError, StageError):
            with self._lock:
                if self._copies.get(path) is got:
                    del self._copies[path]
            raise
        with self._lock:
            got.users += 1

        def release() -> None:
            with self._lock:
                got.users -= 1
                stale = got.users == 0 and self._copies.get(path) is not got
            if stale:
                self._remove(got)

        return source, release

    def _build(self, path: str, stamp: SourceStamp, restarts: Restarts, raw: Source, why: str,
               background: bool = False) -> Copy:
        """Decode the whole file into a new copy (checksums verified, size checked); stops at
        unmount."""
        directory = self._directory()
        target = os.path.join(directory, f"{len(self._copies)}-{stamp.ino}-{stamp.mtime_ns}")
        size = int(restarts.plain[-1])
        self.kept.trim(size)
        t0 = time.monotonic()
        fd = getattr(raw, "fd", -1) if background else -1  # a local file: decoded by a child process
        written = 0
        stopping = lambda: self._closing  # noqa: E731

        def decode(out: BinaryIO) -> None:
            nonlocal written
            with change_first(raw):
                end = restarts.end(stamp.size)  # not a gzip file's zero padding
                got = (decode_in_child(fd, end, restarts.codec, out, directory, path, BACKGROUND_NICE, stopping)
                       if fd >= 0 else decode_into(out, directory, restarts.codec, raw.read_range, end, path,
                                                   background, stopping))
            if got is None:
                raise Stopped
            written = got
            if written != size:
                raise StaleSourceError(path, None, f"decodes to {written} bytes now, {size} when indexed")
            raw.verify_open()  # decoded from the indexed version to its end

        write_atomically(Path(target), decode, prefix="part-", sync=False)
        seconds = time.monotonic() - t0
        log.info("%s: %s: decoded copy of %d bytes in %s (%.1f s)", path, why, written, target, seconds)
        return self._made_now(path, Copy(target, stamp, seconds, "in the background" if background
                                         else "at the first open"))

    def _made_now(self, path: str, got: Copy) -> Copy:
        with self._lock:
            old = self._copies.get(path)
            self._copies[path] = got
        if old is not None and old.users == 0:
            self._remove(old)
        return got

    def _directory(self) -> str:
        with self._lock:
            if self._dir is None:
                os.makedirs(self.root, exist_ok=True)
                self._dir, self._hold = scratch.held(self.root, COPY_PREFIX)
            return self._dir

    def _drop(self, path: str, got: Copy) -> None:
        with self._lock:
            if self._copies.get(path) is got:
                del self._copies[path]
        self._remove(got)

    @staticmethod
    def _remove(got: Copy | CopyTarget) -> None:
        try:
            os.unlink(got.path)
        except FileNotFoundError:
            pass

    def describe(self) -> dict[str, Any]:
        """For ``shufflefs stat``: the decoded copies and where they are."""
        with self._lock:
            copies = {p: {"bytes": os.path.getsize(c.path) if os.path.exists(c.path) else 0, "views": c.users,
                          "seconds": round(c.seconds, 2), "made": c.made} for p, c in self._copies.items()}
        return {"dir": self._dir or self.root, "copies": copies, "bytes": sum(c["bytes"] for c in copies.values()),
                "orders_from_copies": self.copy_all, "background": self.background,
                "being_made": sorted(p for p, st in self._making.items() if st == "being made"),
                "queued": sorted(p for p, st in self._making.items() if st == "queued"), "refused": dict(self._refused),
                "kept_for_later_mounts": self.kept.describe()}

    def close(self) -> None:
        """Remove every copy, close the decoders kept for the next opens (at unmount)."""
        close_kept()
        with self._lock:
            self._closing = True
            worker = self._worker
        if worker is not None:  # it stops at its copy's next step (`_build`)
            worker.join(timeout=30)
        with self._lock:
            directory, hold, copies = self._dir, self._hold, self._copies
            self._dir, self._hold, self._copies = None, -1, {}
        for path, got in copies.items():  # finished copies: the next mount reads them (`kept_copies`)
            self.kept.keep(path, got.stamp, got.path)
        if copies:
            self.kept.trim()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if hold >= 0:
            os.close(hold)
