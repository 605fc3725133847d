"""Which shard set (pool) a data file of a mounted source belongs to, read from the source tree.

Blocking (listings and stats); the filesystem calls it from worker threads.  Name-recognised
sets live in one directory, so without declared globs a lookup lists only the file's directory,
again only when the directory's mtime changed (a file added, removed or renamed).  Declared globs
may span directories: then the whole tree is walked, at most once per `TREE_TTL` seconds.
Members' stamps (size, mtime, inode, ctime) are read again after `STAMP_TTL` seconds; they identify
the pool's version, and every window load checks the files themselves anyway.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from . import resolve
from .index import SourceStamp
from .pools import ShardSet, find_sets, membership

TREE_TTL = 1.0
STAMP_TTL = 1.0


@dataclass(frozen=True)
class PoolEntry:
    """A member's place in its pool, and the stamps of all members (in shard order)."""

    pool: ShardSet
    shard: int
    stamps: tuple[SourceStamp, ...]


class PoolTable:
    """``find(relpath)``: the file's `PoolEntry`, or None for a file that is no shard of a set."""

    def __init__(self, source: str, format_of: Callable[[str], str | None], globs: Sequence[str] = ()) -> None:
        self.source = source
        self.format_of = format_of
        self.globs = tuple(globs)
        self._lock = threading.Lock()
        self._dirs: dict[str, tuple[int, dict[str, tuple[ShardSet, int]]]] = {}
        self._tree: tuple[float, dict[str, tuple[ShardSet, int]]] | None = None
        self._stamps: dict[tuple, tuple[float, tuple[SourceStamp, ...]]] = {}

    def _path(self, relpath: str) -> str:
        return os.path.join(self.source, relpath) if relpath else self.source

    def _files(self, directory: str) -> list[str]:
        out = []
        fd = resolve.open_path(self._path(directory), os.O_RDONLY | os.O_DIRECTORY)
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        out.append(f"{directory}/{e.name}" if directory else e.name)
        finally:
            os.close(fd)
        return out

    def _walk(self) -> list[str]:
        out = []
        for root, dirs, files in os.walk(self.source):
            rel = os.path.relpath(root, self.source)
            rel = "" if rel == "." else rel
            dirs.sort()
            for name in files:
                p = f"{rel}/{name}" if rel else name
                if stat.S_ISREG(os.lstat(os.path.join(root, name)).st_mode):
                    out.append(p)
        return out

    def _members(self, relpath: str) -> dict[str, tuple[ShardSet, int]]:
        if self.globs:
            now = time.monotonic()
            if self._tree is None or now - self._tree[0] > TREE_TTL:
                sets, _ = find_sets(self._walk(), self.format_of, self.globs)
                self._tree = (now, membership(sets))
            return self._tree[1]
        directory = os.path.dirname(relpath)
        mtime = resolve.stat_path(self._path(directory)).st_mtime_ns
        known = self._dirs.get(directory)
        if known is None or known[0] != mtime:
            sets, _ = find_sets(self._files(directory), self.format_of)
            if len(self._dirs) > 4096:
                self._dirs.clear()
            known = self._dirs[directory] = (mtime, membership(sets))
        return known[1]

    def find(self, relpath: str, own: SourceStamp | None = None) -> PoolEntry | None:
        """``own``: the file's stamp as just read; the members' are read again if it differs."""
        with self._lock:
            got = self._members(relpath).get(relpath)
            if got is None:
                return None
            pool, shard = got
            now = time.monotonic()
            key = (pool.key, pool.members)
            known = self._stamps.get(key)
            if known is None or now - known[0] > STAMP_TTL or (own is not None and known[1][shard] != own):
                stamps = tuple(SourceStamp.of(resolve.stat_path(self._path(m))) for m in pool.members)
                if len(self._stamps) > 4096:
                    self._stamps.clear()
                known = self._stamps[key] = (now, stamps)
            return PoolEntry(pool, shard, known[1])
