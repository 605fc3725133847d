"""Which shard set (pool) a data file of a mounted source belongs to, read from the source tree.

Blocking (listings and stats of the mount's `sources.Store`); the catalog calls it from worker threads.  Name-recognised
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

from ..index.table import SourceStamp
from ..sources.base import Store
from .shards import ShardSet, find_sets, membership

TREE_TTL = 1.0
STAMP_TTL = 1.0


def entries(store: Store, directory: str) -> tuple[list[str], list[str]]:
    """The regular files and the directories in ``directory`` (links followed by neither)."""
    files, dirs = [], []
    for name in sorted(store.list(directory)):
        p = f"{directory}/{name}" if directory else name
        try:
            mode = store.stat(p).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISREG(mode):
            files.append(p)
        elif stat.S_ISDIR(mode):
            dirs.append(p)
    return files, dirs


def walk(store: Store, under: str = "") -> list[str]:
    """Every regular file of the store's tree, or of its directory ``under``, links not
    followed; a directory that is missing (or leaves during the walk) holds none."""
    out, todo = [], [under]
    while todo:
        try:
            files, dirs = entries(store, todo.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone (or never there): nothing under it
        out.extend(files)
        todo.extend(reversed(dirs))
    return out


@dataclass(frozen=True)
class PoolEntry:
    """A member's place in its pool, and the stamps of all members (in shard order).  Output
    shard i of the pool has member i's name; a mixture's entry (`mixes.MixEntry`) has the same
    attributes and names of its own."""

    pool: ShardSet
    shard: int
    stamps: tuple[SourceStamp, ...]
    mix = None

    @property
    def shards(self) -> int:
        return len(self.pool.members)

    @property
    def shard_paths(self) -> tuple[str, ...]:
        """The relative paths of the output shards, in order."""
        return self.pool.members

    @property
    def epoch_path(self) -> str:
        """Whose epoch the shards follow: the first member's."""
        return self.pool.members[0]

    @property
    def epoch_paths(self) -> tuple[str, ...]:
        """The paths an epoch set on one shard is set on."""
        return self.pool.members


class PoolTable:
    """``find(relpath)``: the file's `PoolEntry`, or None for a file that is no shard of a set."""

    def __init__(self, store: Store, format_of: Callable[[str], str | None], globs: Sequence[str] = ()) -> None:
        self.store = store
        self.format_of = format_of
        self.globs = tuple(globs)
        self._lock = threading.Lock()
        self._dirs: dict[str, tuple[int, dict[str, tuple[ShardSet, int]]]] = {}
        self._tree: tuple[float, dict[str, tuple[ShardSet, int]]] | None = None
        self._stamps: dict[tuple, tuple[float, tuple[SourceStamp, ...]]] = {}

    def _entries(self, directory: str) -> tuple[list[str], list[str]]:
        return entries(self.store, directory)

    def _walk(self) -> list[str]:
        return walk(self.store)

    def _members(self, relpath: str) -> dict[str, tuple[ShardSet, int]]:
        if self.globs:
            now = time.monotonic()
            if self._tree is None or now - self._tree[0] > TREE_TTL:
                sets, _ = find_sets(self._walk(), self.format_of, self.globs)
                self._tree = (now, membership(sets))
            return self._tree[1]
        directory = os.path.dirname(relpath)
        mtime = self.store.stat(directory, follow_last=True).st_mtime_ns
        known = self._dirs.get(directory)
        if known is None or known[0] != mtime:
            sets, _ = find_sets(self._entries(directory)[0], self.format_of)
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
                stamps = tuple(SourceStamp.of(self.store.stat(m, follow_last=True)) for m in pool.members)
                if len(self._stamps) > 4096:
                    self._stamps.clear()
                known = self._stamps[key] = (now, stamps)
            return PoolEntry(pool, shard, known[1])

    def note(self, pool: ShardSet, stamps: tuple[SourceStamp, ...] | None) -> None:
        """The members' stamps as just read (an open found one changed): the next lookups take
        them; None: read them again at the next lookup (a member is gone)."""
        with self._lock:
            key = (pool.key, pool.members)
            if stamps is None:
                self._stamps.pop(key, None)
            else:
                self._stamps[key] = (time.monotonic(), stamps)
