"""The catalog's vocabulary: nodes (one per inode), directory probes, open handles, and the
errno a request ends with.  No FUSE import: the adapter (`shufflefs.fs.fuse_ops`) maps these onto pyfuse3.
"""

from __future__ import annotations

import os
import stat
import time

from ..formats import Format
from ..index.table import RecordIndex, SourceStamp
from ..pools.access import Access
from ..pools.lookup import PoolEntry
from ..pools.mixes import MixEntry
from ..strategies import Plan
from ..windows.cache import Slot
from ..windows.layout import Layout
from ..windows.shared_view import SharedView

ROOT = 1
"""The root's inode number (FUSE's)."""
DIR, FILE, LINK, VIEW = "dir", "file", "link", "view"
ROLE_PARTS, ROLE_COUNT = "parts", "count"
MAX_PARTS = 4096


class Reply(Exception):
    """A request ends with this errno (already logged where the reader needs a log line)."""

    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.errno = code


class Node:
    """One inode.  ``lookups`` is the kernel's reference count (lookup/readdir minus forget)."""

    __slots__ = (
        "ino", "kind", "relpath", "key", "lookups", "st", "target", "fmt", "epoch", "stamp", "size",
        "plan", "layout", "index", "view", "opens", "broken", "part", "parts", "role", "pool", "frame",
        "trusted", "resume", "resume_problem",
    )

    def __init__(self, ino: int, kind: str, relpath: str, key: tuple, st: os.stat_result | Stat) -> None:
        self.ino, self.kind, self.relpath, self.key, self.st = ino, kind, relpath, key, st
        self.lookups = 0
        self.target: str | None = None
        self.fmt: Format | None = None
        self.epoch = 0
        self.stamp: SourceStamp | None = None
        self.size = st.st_size
        # view state, built on first open or xattr query
        self.index: RecordIndex | None = None
        self.plan: Plan | None = None
        self.layout: Layout | None = None
        self.view: SharedView | None = None
        self.opens = 0
        self.broken: Exception | None = None  # a ShuffleError: the view can never be read again
        # loader parts: the node shows the ``part``-th of ``parts`` pieces of the rank's share
        self.part, self.parts = 0, 1
        self.role: str | None = None  # ROLE_PARTS or ROLE_COUNT for the directories naming a split
        # a shard of a pool: shows a stretch of the pool's stream, framed by its own header/trailer
        self.pool: PoolEntry | MixEntry | None = None
        self.frame: tuple[bytes, bytes] | None = None
        # False: last looked up from a recent listing's attributes, so an open checks the version
        self.trusted = True
        # a resumed view: the layouts its epoch ran under (`strategies.resume`); () shows it whole
        self.resume: tuple = ()
        self.resume_problem: str | None = None  # a state that cannot apply to it: opens get EINVAL

    @property
    def epoch_path(self) -> str:
        """The file whose epoch this node follows: a pool's shards all follow its first member,
        a mixture's its ``.mix/NAME``."""
        return self.pool.epoch_path if self.pool is not None else self.relpath

    @property
    def space(self) -> tuple[int, int]:
        """``(part, parts)``: the loader part whose tree the node is in (``(0, 1)``: the mount's)."""
        return self.part, self.parts


def frame_file(node: Node) -> tuple[str, SourceStamp]:
    """The file (and its version) whose header and trailer a view shows: its own, or for a
    mixture's shard its first file's."""
    if node.pool is not None and node.pool.mix is not None:
        return node.pool.pool.members[0], node.pool.stamps[0]
    return node.relpath, node.stamp


class Stat:
    """The attributes the mount shows and versions by, without the rest of an ``os.stat_result``
    (a node per listed entry: a directory of 100,000 files holds 100,000 of these)."""

    __slots__ = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns",
                 "st_mtime_ns", "st_ctime_ns", "st_blksize", "st_blocks")

    def __init__(self, st: os.stat_result) -> None:
        self.st_mode, self.st_ino, self.st_nlink = st.st_mode, st.st_ino, st.st_nlink
        self.st_uid, self.st_gid, self.st_size = st.st_uid, st.st_gid, st.st_size
        self.st_atime_ns, self.st_mtime_ns, self.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        self.st_blksize, self.st_blocks = st.st_blksize, st.st_blocks


def shard_stat(st: os.stat_result | Stat, access: Access) -> Stat:
    """A shard's attributes: ``st`` with the mode and owners under which the kernel lets only
    whoever may read every member read it (`pools.access`)."""
    out = Stat(st)
    out.st_mode = stat.S_IFMT(st.st_mode) | access.mode
    out.st_uid, out.st_gid = access.uid, access.gid
    return out


UNREAD = -1
"""`Probe.last_byte` of a file whose last byte was not read (listings read none)."""
NO_POOL = object()
"""`Probe.pool` before pools were looked up (a store without pools, or a test's own probe)."""


class Probe:
    """What a directory entry is, gathered on a worker thread: its attributes (``at``: when, by
    ``time.monotonic``), format, last byte (`UNREAD` if not read), link target and pool."""

    __slots__ = ("name", "st", "fmt", "last_byte", "target", "pool", "at")

    def __init__(self, name: str, st: os.stat_result | Stat, fmt: Format | None, last_byte: int | None,
                 target: str | None, pool: object = NO_POOL, at: float = 0.0):
        self.name, self.st, self.fmt, self.last_byte, self.target = name, st, fmt, last_byte, target
        self.pool, self.at = pool, at


class Handle:
    """An open file.  For views: the window it reads now (``slot``, held in the window cache),
    which sits at view bytes ``[lo, hi)``, and where its last reads end (`continues`).  A
    pass-through file's handle holds its open ``source``."""

    __slots__ = ("node", "source", "last_end", "ends", "slot", "k", "lo", "hi", "shift", "opened", "fh", "offered")

    def __init__(self, node: Node, source: object | None = None) -> None:
        self.node, self.source, self.last_end = node, source, 0
        self.ends = [-1] * (STREAMS - 1) + [0]  # where the last reads asked for end, most recent last
        self.opened = time.monotonic_ns()  # a read after an error clears it only through a later open
        self.slot: Slot | None = None
        self.k = -1  # the view window ``slot`` holds
        self.lo, self.hi = 0, -1  # no window: no read is inside it
        self.shift = 0  # view byte ``lo`` is byte ``shift`` of the slot (a shard's stretch of a stream window)
        self.fh: int | None = None  # the kernel's number for it (compiled replies are keyed by it)
        self.offered: Slot | None = None  # the window the compiled replies answer reads from (`serve.replies`)


    def continues(self, off: int, end: int) -> bool:
        """Whether a read of ``[off, end)`` continues one of the handle's last `STREAMS` reads
        (noted as asked, before they are answered), and note it.  Readers read several streams
        of one handle at once (pyarrow reads a row group's column chunks from several threads,
        the kernel has a read and its readahead in flight): each stream is sequential although
        consecutive reads are not."""
        ends = self.ends
        hit = off in ends
        if hit:
            ends.remove(off)
        else:
            del ends[0]
        ends.append(end)
        return hit

    def noted(self, end: int) -> None:
        """Reads answered without Python (`serve.replies`) ended at ``end``: the next read that
        starts there continues them."""
        self.last_end = end
        if end not in self.ends:
            del self.ends[0]
            self.ends.append(end)


STREAMS = 4
"""Reads of one handle whose ends are remembered (`Handle.continues`)."""


def view_mtime_ns(source_mtime_ns: int, epoch: int) -> int:
    """A view's mtime: its source's plus one second per epoch.  Readers that cache by path, size
    and mtime (Hugging Face ``datasets``) then see every epoch as a new file instead of serving
    epoch 0's order again; a function of the source and the epoch only, so every rank and every
    remount shows the same value."""
    return source_mtime_ns + epoch * 1_000_000_000
