"""Whole copies of compressed objects on node-local disk: what a bucket's ``.jsonl.gz`` and
``.jsonl.zst`` views decode from.

Decoding reads a compressed file's bytes in small pieces and again at every restart point a
read starts from (`formats.codecs`): through ranged GETs that would be many small requests every
epoch.  A compressed object is instead downloaded whole, once per version, in parallel parts of
at most 8 MiB pinned to its ETag, into a file of its own under the cache directory (the download
that indexing the object takes fills it, so a first epoch costs no more GETs than its index
did); the views then decode it as a local file (`PackedFile`), and no read of it makes a
request.  A copy stays while the mount runs; a newer version's copy replaces it once no source
reads it, and every copy is removed at unmount (a killed mount's by the next one there,
`scratch.held`).  Compressed objects are about a third or less of their decoded bytes, so the
copies are smaller than the decoded copies that orders reading record by record make.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from .. import scratch
from ..index.table import SourceStamp, write_atomically
from .local import SourceFile

log = logging.getLogger("shufflefs")

PREFIX = "packed-"
"""The prefix of the directories that hold a mount's copies (`scratch.held`)."""


class PackedFile(SourceFile):
    """A copy of one object version read as a local file; ``release`` when it is closed."""

    def __init__(self, path: str, release: Callable[[], None]) -> None:
        super().__init__(path, SourceStamp.of(os.stat(path)))
        self._release: Callable[[], None] | None = release

    def close(self) -> None:
        try:
            super().close()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class _Copy:
    def __init__(self, path: str, stamp: SourceStamp) -> None:
        self.path, self.stamp, self.users = path, stamp, 0


class PackedCopies:
    """The copies of one mount (module docstring), by the object's relative path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._copies: dict[str, _Copy] = {}
        self._dir: str | None = None
        self._hold = -1
        self.downloaded = 0
        """Bytes downloaded into copies (`shufflefs stat`)."""

    def path_of(self, relpath: str, stamp: SourceStamp, root: str,
                fetch: Callable[[np.ndarray], None]) -> str:
        """The copy of ``relpath`` at version ``stamp``, made now under ``root`` if there is none
        (``fetch(out)``: the object's bytes into ``out``, the copy mapped for writing)."""
        with self._lock:
            building = self._building.setdefault(relpath, threading.Lock())
        with building:
            with self._lock:
                got = self._copies.get(relpath)
            if got is not None and got.stamp == stamp:
                return got.path
            directory = self._directory(root)
            with self._lock:
                target = os.path.join(directory, f"{len(self._copies)}-{stamp.ino}-{stamp.mtime_ns}")

            def fill(f: BinaryIO) -> None:
                if stamp.size:
                    os.posix_fallocate(f.fileno(), 0, stamp.size)  # a full disk is ENOSPC here, not SIGBUS
                    out = np.memmap(f, np.uint8, "r+")
                    try:
                        fetch(out)
                        out.flush()
                    finally:
                        del out

            write_atomically(Path(target), fill, prefix="part-", sync=False)
            with self._lock:
                self.downloaded += stamp.size
                old = self._copies.get(relpath)
                self._copies[relpath] = _Copy(target, stamp)
            if old is not None and old.users == 0:
                _remove(old.path)
            return target

    def open(self, relpath: str, stamp: SourceStamp, root: str, fetch: Callable[[np.ndarray], None]) -> PackedFile:
        """A source reading the copy of ``relpath`` at ``stamp`` (made now if there is none)."""
        while True:
            path = self.path_of(relpath, stamp, root, fetch)
            with self._lock:
                got = self._copies.get(relpath)
                if got is None or got.path != path:
                    continue  # replaced by a newer version meanwhile: that one's copy is not ours
                got.users += 1
            break

        def release() -> None:
            with self._lock:
                got.users -= 1
                stale = got.users == 0 and self._copies.get(relpath) is not got
            if stale:
                _remove(got.path)

        try:
            return PackedFile(path, release)
        except BaseException:
            release()
            raise

    def _directory(self, root: str) -> str:
        with self._lock:
            if self._dir is None:
                os.makedirs(root, exist_ok=True)
                self._dir, self._hold = scratch.held(root, PREFIX)
            return self._dir

    def describe(self) -> dict:
        with self._lock:
            return {"dir": self._dir, "copies": len(self._copies),
                    "bytes": sum(c.stamp.size for c in self._copies.values()), "downloaded": self.downloaded}

    def close(self) -> None:
        """Remove every copy (at unmount)."""
        with self._lock:
            directory, hold = self._dir, self._hold
            self._dir, self._hold, self._copies = None, -1, {}
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if hold >= 0:
            os.close(hold)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
