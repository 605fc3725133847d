"""Decoded copies kept from one mount to the next, on the node-local disk they were made on.

A compressed file's copy costs a whole decode (seconds per GiB), and a mount that finds its index
cached made it again in the background while the first epoch decoded from restart points.  At
unmount a mount's finished copies move (a rename: no byte is written) to ``ROOT/kept-copies``,
named by the source's path and version; a later mount of that root takes a copy back (a rename
again, so two mounts never share one) when it opens the same version, after checking that the
copy is the file that was kept (its size, modification time and inode).  A source that changed
in between never matches, and the copies of its older versions are removed then.  Kept copies
never crowd out live ones: whenever a copy needs room, and at every unmount, the least recently
kept are removed until the disk keeps the room the mount's copies leave free (`room`).  Nothing
is kept on a filesystem held in memory (`in_memory`).  Blocking, no FUSE."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from typing import Any, Callable, NamedTuple

from ..index.table import SourceStamp

log = logging.getLogger("shufflefs")

KEPT_DIR = "kept-copies"
FREE_KEPT = 0.10
"""Of the copies' filesystem, the part that background copies leave free (and at least
`FREE_KEPT_BYTES`): a corpus larger than the disk is read from restart points, never fills it."""
FREE_KEPT_BYTES = 1 << 30
SPARE, SPARES = "spare", 3
"""The name kept scratch files start with, and how many are kept (`KeptCopies.keep_spare`)."""


class _Entry(NamedTuple):
    path: str
    name_key: str
    version_key: str
    mtime_ns: int
    kept_ns: int


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=10).hexdigest()


def keys_of(source_path: str, stamp: SourceStamp, layout: str = "") -> tuple[str, str]:
    """(the key of the source's path, of its version and the copy's ``layout``)."""
    return _hash(source_path), _hash(f"{source_path}\0{stamp.size}\0{stamp.mtime_ns}\0{stamp.ino}\0{stamp.ctime_ns}"
                                     + (f"\0{layout}" if layout else ""))


class KeptCopies:
    """The kept copies under ``root`` (module docstring).  ``room``: (free bytes of the disk,
    bytes to leave free), or None when unknown."""

    def __init__(self, root: str | os.PathLike, room: Callable[[], tuple[int, int] | None]) -> None:
        self.dir = os.path.join(os.fspath(root), KEPT_DIR)
        self.room = room
        self._found: dict[str, list[_Entry]] | None = None  # what `take` finds, listed once

    def _kept_of(self, name_key: str) -> list[_Entry]:
        """The entries of one source path, from one listing per mount (a pool's thousand shards
        are not a thousand listings; copies kept by other mounts since are not looked for)."""
        if self._found is None:
            found: dict[str, list[_Entry]] = {}
            for e in self._entries():
                found.setdefault(e.name_key, []).append(e)
            self._found = found
        return self._found.pop(name_key, [])

    def _entries(self) -> list[_Entry]:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        out = []
        for name in names:
            parts = name.split(".")
            keys = parts[0].split("-")
            if len(parts) != 3 or len(keys) != 2 or not (parts[1].isdigit() and parts[2].isdigit()):
                continue  # not one of ours (a rename under way has a hidden name)
            out.append(_Entry(os.path.join(self.dir, name), keys[0], keys[1], int(parts[1]), int(parts[2])))
        return out

    def take(self, source_path: str, stamp: SourceStamp, size: int, into: str, layout: str = "") -> str | None:
        """The kept copy of this version of ``source_path`` (in ``layout``: "" for a decoded
        stream), moved to the file ``into`` (None if there is none, or it is not what was kept:
        then it is removed); copies of its other versions are removed."""
        name_key, version_key = keys_of(source_path, stamp, layout)
        taken = None
        for e in self._kept_of(name_key):
            if e.version_key != version_key or taken is not None:
                _unlink(e.path)
                continue
            try:
                os.rename(e.path, into)  # another mount that took it first: not found
            except FileNotFoundError:
                continue
            try:
                st = os.stat(into)
            except OSError:
                continue
            if st.st_size != size or st.st_mtime_ns != e.mtime_ns or st.st_nlink != 1:
                log.warning("%s: its kept decoded copy %s changed since it was kept (%d bytes, %d expected): "
                            "removed", source_path, e.path, st.st_size, size)
                _unlink(into)
                continue
            taken = into
        return taken

    def keep(self, source_path: str, stamp: SourceStamp, copy: str, layout: str = "") -> bool:
        """Move the finished copy ``copy`` of this version of ``source_path`` (in ``layout``)
        here (at unmount)."""
        name_key, version_key = keys_of(source_path, stamp, layout)
        if in_memory(copy):
            log.info("%s: its decoded copy is not kept for the next mount: %s is in memory", source_path, copy)
            return False
        try:
            os.makedirs(self.dir, exist_ok=True)
            st = os.stat(copy)
            for e in self._entries():
                if e.name_key == name_key:
                    _unlink(e.path)  # another version's, or this one's from a mount before
            os.rename(copy, os.path.join(self.dir, f"{name_key}-{version_key}.{st.st_mtime_ns}.{time.time_ns()}"))
        except OSError as e:
            log.info("%s: its decoded copy is not kept for the next mount: %s", source_path, e)
            return False
        return True

    def keep_spare(self, fd: int, path: str | None = None, key: str | None = None) -> bool:
        """Name the scratch file ``fd`` here (at ``path`` if it has a name; nameless otherwise)
        for the next mount to write its stages into: its blocks and cached pages are reused (a
        stage written into a new file cost 2.8 s, 0.40 into a used one).  ``key``: what it
        holds, a whole stage a later mount may take as it is (`take_stage`; `stage_keys`).  At
        most `SPARES`: a larger file takes the place of the smallest (`take_spare` prefers one
        large enough)."""
        if in_memory(self.dir):
            return False
        st = os.fstat(fd)
        spares = [e for e in self._entries() if e.name_key == SPARE]
        if len(spares) >= SPARES:
            smallest = min((_size(e.path), e.path) for e in spares)
            if len(spares) > SPARES or smallest[0] >= st.st_size or not _unlink(smallest[1]):
                return False
        try:
            os.makedirs(self.dir, exist_ok=True)
            name = os.path.join(self.dir, f"{SPARE}-{key or time.time_ns()}.{st.st_mtime_ns}.{time.time_ns()}")
            if path is not None:
                os.rename(path, name)
                return True
            fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # linkat(AT_SYMLINK_FOLLOW) names the nameless file itself, not its /proc link
                os.link(str(fd), name, src_dir_fd=fds, follow_symlinks=True)
            finally:
                os.close(fds)
        except OSError as e:
            log.debug("a stage file is not left for the next mount: %s", e)
            return False  # (no /proc, say): closed as before
        return True

    def take_spare(self, into: str, size: int = 0) -> int | None:
        """A spare scratch file an earlier mount left (`keep_spare`), moved to ``into`` (a
        rename: one mount takes it) and open; None if there is none.  Of the spares about
        ``size`` bytes or more (`fit`) the newest (its pages the likeliest cached), else the
        largest: a stage grown past its file's old end allocates every new page (a whole-file
        stage written into a shard's spare); of those alike, one not holding a kept stage first
        (`take_stage`).  Every entry named like a spare that is not a plain
        file of this daemon's user (by ``lstat``: a FIFO would block an open) is removed first,
        whichever one is taken."""
        spares = []
        for e in self._entries():
            if e.name_key != SPARE:
                continue
            try:
                st = os.lstat(e.path)
            except OSError:
                continue
            if _ours(st):
                spares.append((e, st.st_size))
            else:
                _unlink(e.path)
        spares.sort(key=lambda x: fit(x[1], size, x[0].kept_ns, _holds_stage(x[0])), reverse=True)
        for e, _ in spares:
            got = _moved_open(e.path, into)
            if got is None:
                continue
            fd, st = got
            if not _ours(st):
                os.close(fd)  # not a file this daemon would make (replaced since the lstat)
                _unlink(into)
                continue
            return fd
        return None

    def take_stage(self, into: str, key: str, size: int) -> int | None:
        """The spare that holds the stage known by ``key`` (`keep_spare`), ``size`` bytes, moved
        to ``into`` and open; None if there is none.  One whose size or modification time is
        not what it was when kept is not trusted: it stays a spare, its key dropped."""
        for e in self._entries():
            if e.name_key != SPARE or e.version_key != key or (got := _moved_open(e.path, into)) is None:
                continue
            fd, st = got
            if _ours(st) and st.st_size == size and st.st_mtime_ns == e.mtime_ns:
                return fd
            log.warning("the kept stage %s changed since it was kept (%d bytes, %d expected): not taken",
                        e.path, st.st_size, size)
            try:
                if not _ours(st) or not self.keep_spare(fd, into):
                    _unlink(into)
            finally:
                os.close(fd)
        return None

    def trim(self, needed: int = 0) -> int:
        """Remove the least recently kept copies until ``needed`` bytes more leave the disk its
        free room; returns the bytes removed."""
        removed = 0
        for e in sorted(self._entries(), key=lambda e: e.kept_ns):
            got = self.room()
            if got is None or got[0] - needed >= got[1]:
                break
            try:
                size = os.stat(e.path).st_size
            except OSError:
                continue
            if _unlink(e.path):
                removed += size
                log.info("removed the kept decoded copy %s (%d bytes) for room", e.path, size)
        return removed

    def describe(self) -> dict[str, int]:
        """For ``shufflefs stat``: how many copies are kept, and their bytes (spare files apart)."""
        sizes = []
        for e in self._entries():
            if e.name_key == SPARE:
                continue
            try:
                sizes.append(os.stat(e.path).st_size)
            except OSError:
                pass
        return {"files": len(sizes), "bytes": sum(sizes)}


MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def in_memory(path: str) -> bool:
    """Whether ``path`` (or its nearest existing parent) is on a filesystem held in memory, where
    a file kept after the unmount would hold memory until the next mount: nothing is kept there."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if " - " not in line or len(fields) < 5:
                    continue
                point = fields[4].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best):
                    best, kind = point, line.split(" - ", 1)[1].split()[0]
    except OSError:
        return False
    return kind in MEMORY_FILESYSTEMS


def fit(have: int, size: int, recency: int, holds_stage: bool = False) -> tuple[bool, bool, int]:
    """How well a scratch file of ``have`` bytes, used ``recency`` (larger: later), suits a
    stage of ``size`` (larger: better): one at most an eighth short (stages of one file differ
    by a few bytes from epoch to epoch), of those one that does not hold a whole stage a later
    reader may take as it is (`KeptCopies.take_stage`), the latest first (its pages the
    likeliest cached); else the largest (a stage grown past a file's end allocates every page
    it adds)."""
    near = have >= size - size // 8
    return near, not holds_stage, recency if near else have


def _moved_open(path: str, into: str) -> tuple[int, os.stat_result] | None:
    """The file at ``path`` moved to ``into`` (a rename: one mount takes it), open read-write, and
    its status; None if another took it first, or it cannot be opened (then it is removed)."""
    try:
        os.rename(path, into)
    except OSError:
        return None
    try:
        fd = os.open(into, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        _unlink(into)
        return None
    return fd, os.fstat(fd)


def _holds_stage(e: _Entry) -> bool:
    """Whether a spare is named by the stage it holds (`KeptCopies.keep_spare`)."""
    return not e.version_key.isdigit()


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _ours(st: os.stat_result) -> bool:
    """Whether a spare is a file this daemon would leave: plain, of its user, of one name."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class CopyDisk:
    """The node-local disk decoded copies go on (``root``): how much room it keeps free, and the
    copies kept there for later mounts, which give way to the copies in use."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)
        self.kept = KeptCopies(self.root, self.room)

    def room_for(self, size: int) -> str | None:
        """Why a background copy of ``size`` bytes may not be made now (None: it may): the disk
        keeps `FREE_KEPT` of itself and `FREE_KEPT_BYTES` free besides it, once the copies kept
        for later mounts made what room they can.  Asked between copies, which one thread makes
        one at a time, so no other is under way."""
        self.kept.trim(size)
        where, free, keep = self.free_space()
        if free is None:
            return f"the free space of {where} is unknown ({keep})"
        if free - size < keep:
            return f"{size:,} decoded bytes would leave less than {keep:,} of {where}'s {free:,} free bytes"
        return None

    def free_space(self) -> tuple[str, int | None, Any]:
        """(the copies' directory or its nearest existing parent, its free bytes, the bytes copies
        leave free), or (where, None, why not known)."""
        where = self.root
        while not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        try:
            st = os.statvfs(where)
        except OSError as e:
            return where, None, e.strerror
        return where, st.f_bavail * st.f_frsize, max(int(FREE_KEPT * st.f_blocks * st.f_frsize), FREE_KEPT_BYTES)

    def room(self) -> tuple[int, int] | None:
        """(free bytes, bytes to leave free), or None if not known."""
        _, free, keep = self.free_space()
        return None if free is None else (free, keep)
