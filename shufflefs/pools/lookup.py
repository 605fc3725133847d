"""Which shard set (pool) a data file of a mounted source belongs to, read from the source tree.

Blocking (listings and stats of the mount's `sources.Store`); the catalog calls it from worker threads.  Name-recognised
sets live in one directory, so without declared globs a lookup lists only the file's directory,
again only when the directory's mtime changed (a file added, removed or renamed).  Declared globs
may span directories: then the whole tree is walked, at most once per `TREE_TTL` seconds.
Members' stamps (size, mtime, inode, ctime) are read again after `STAMP_TTL` seconds; they identify
the pool's version, and every window load checks the files themselves anyway.  The same reading
gives the mode and owners of the pool's shards (`access.combine`: readable only by whoever may read
every member, and enter every directory on the way to one where the members span directories).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

from ..index.table import SourceStamp
from ..sources.base import Store
from .access import Access, combine, passages
from .shards import ShardSet, find_sets, membership

TREE_TTL = 1.0
STAMP_TTL = 1.0


def entries(store: Store, directory: str, seen: dict[str, Access] | None = None) -> tuple[list[str], list[str]]:
    """The regular files and the directories in ``directory`` (links followed by neither);
    ``seen`` takes the directories' modes and owners."""
    files, dirs = [], []
    for name in sorted(store.list(directory)):
        p = f"{directory}/{name}" if directory else name
        try:
            st = store.stat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append(p)
        elif stat.S_ISDIR(st.st_mode):
            dirs.append(p)
            if seen is not None:
                seen[p] = Access.of(st)
    return files, dirs


def walk(store: Store, under: str = "", seen: dict[str, Access] | None = None) -> list[str]:
    """Every regular file of the store's tree, or of its directory ``under``, links not
    followed; a directory that is missing (or leaves during the walk) holds none.  ``seen``
    takes the modes and owners of the directories met beneath ``under``."""
    out, todo = [], [under]
    while todo:
        try:
            files, dirs = entries(store, todo.pop(), seen)
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone (or never there): nothing under it
        out.extend(files)
        todo.extend(reversed(dirs))
    return out


@dataclass(frozen=True)
class Known:
    """The members' stamps as read at ``at`` (`time.monotonic`), their modes and owners, and the
    access of the shards over them."""

    at: float
    stamps: tuple[SourceStamp, ...]
    perms: tuple[Access, ...]
    access: Access


class MemberStamps:
    """The members' stamps of pools (or mixtures) by key, as last read: read again (one stat
    each) after `STAMP_TTL` seconds, when a lookup's own stamp differs, or after `note` of None
    and `stale`.  ``dirs``: the modes of the directories the members may lie in, as last walked
    (`passages`)."""

    def __init__(self, store: Store, limit: int, dirs: Callable[[], Mapping[str, Access]] = dict) -> None:
        self.store, self.limit, self.dirs = store, limit, dirs
        self._lock = threading.Lock()
        self._known: dict[Hashable, Known] = {}

    def get(self, key: Hashable, members: Sequence[str], own: SourceStamp | None = None, shard: int = 0) -> Known:
        """``own``: member ``shard``'s stamp as just read; all are read again if it differs."""
        with self._lock:
            now = time.monotonic()
            known = self._known.get(key)
            if known is None or now - known.at > STAMP_TTL or (own is not None and known.stamps[shard] != own):
                sts = [self.store.stat(m, follow_last=True) for m in members]
                if len(self._known) > self.limit:
                    self._known.clear()
                known = self._known[key] = self._known_of(now, members, tuple(SourceStamp.of(st) for st in sts),
                                                          tuple(Access.of(st) for st in sts))
            return known

    def _known_of(self, at: float, members: Sequence[str], stamps: tuple[SourceStamp, ...],
                  perms: tuple[Access, ...]) -> Known:
        return Known(at, stamps, perms, combine([*perms, *passages(members, self.dirs())]))

    def note(self, key: Hashable, members: Sequence[str],
             got: tuple[tuple[SourceStamp, ...], tuple[Access, ...]] | None) -> None:
        """The members' stamps and modes as just read (an open found one changed): the next
        lookups take them; None: read them again at the next lookup (a member is gone)."""
        with self._lock:
            if got is None:
                self._known.pop(key, None)
            else:
                self._known[key] = self._known_of(time.monotonic(), members, *got)

    def stale(self) -> None:
        """A file changed: read every member's version again at the next lookup."""
        with self._lock:
            self._known.clear()


@dataclass(frozen=True)
class PoolEntry:
    """A member's place in its pool, and the stamps of all members (in shard order).  Output
    shard i of the pool has member i's name; a mixture's entry (`mixes.MixEntry`) has the same
    attributes and names of its own."""

    pool: ShardSet
    shard: int
    stamps: tuple[SourceStamp, ...]
    access: Access | None = None
    """The mode and owners the shard shows (None: its own file's)."""
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
        # declared globs: when the tree was walked, the sets' members, the directories' modes
        self._tree: tuple[float, dict[str, tuple[ShardSet, int]], dict[str, Access]] | None = None
        self._stamps = MemberStamps(store, 4096, self._walked_dirs)

    def _entries(self, directory: str) -> tuple[list[str], list[str]]:
        return entries(self.store, directory)

    def _walked_dirs(self) -> Mapping[str, Access]:
        """The directories a declared set's members may lie in (a name-recognised set's shards
        lie in its members' one directory, which the kernel checks itself)."""
        tree = self._tree
        return tree[2] if tree is not None else {}

    def _members(self, relpath: str) -> dict[str, tuple[ShardSet, int]]:
        if self.globs:
            now = time.monotonic()
            if self._tree is None or now - self._tree[0] > TREE_TTL:
                seen: dict[str, Access] = {}
                sets, _ = find_sets(walk(self.store, "", seen), self.format_of, self.globs)
                self._tree = (now, membership(sets), seen)
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
            known = self._stamps.get((pool.key, pool.members), pool.members, own, shard)
            return PoolEntry(pool, shard, known.stamps, known.access)

    def note(self, pool: ShardSet, got: tuple[tuple[SourceStamp, ...], tuple[Access, ...]] | None) -> None:
        """The members' stamps and modes as just read (`MemberStamps.note`)."""
        self._stamps.note((pool.key, pool.members), pool.members, got)
