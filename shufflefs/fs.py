"""pyfuse3 operations: the source tree mirrored read-only, data files served as shuffled views.

This module only translates between the kernel and the pure layers (formats, index, strategies,
layout); it holds no shuffle logic.

Inodes and epochs.  A data file gets one inode number per (path, epoch, source stamp), never
reused, and its lookups are not cached by the kernel (``entry_timeout=0``), so every ``open``
resolves the epoch current at that moment while a handle opened earlier stays on its own inode
and keeps its epoch.  Because an inode's bytes can never change, ``.npy`` and fixed-size views
can be served through the page cache (``keep_cache``) and so support shared ``mmap``; every other
view uses ``direct_io`` (reads arrive as the application issued them, no copy into the page cache).
Directories, symlinks and pass-through files have one inode per path.  Old inodes disappear
when the kernel forgets them.

Sharing and memory.  All handles of one inode share its plan, its open source file and its
windows (`prefetch.WindowCache`, keyed by inode and window; its docstring has the prefetch design
and the memory limit: `prefetch.WINDOWS` windows of the largest view in memory, for all views
together).  The shards of a pool's stream share the stream's windows (keyed by the stream),
loaded through whichever shard view is open.  The last `IDLE_VIEWS` views whose handles all closed stay open with their windows,
so that a reader that reopens the file per record does not rebuild the plan and reload windows
every time.

Reads.  A handle remembers the window it is reading; a read inside it is one slice of the
window's buffer (no lookup, no await).  Entering a window holds it for the handle and, for a
sequential reader, starts loading the next one.  Setting an epoch starts loading window 0 of the
new epoch's view of the files opened most recently, so the first read after the change finds it
ready or on its way.

All handlers run in the trio thread; anything that touches the disk or gathers records runs on
worker threads (`trio.to_thread.run_sync` with capacity limiters).  The daemon never touches
paths inside its own mount.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import stat
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable, NamedTuple

import numpy as np
import pyfuse3
import trio
from pyfuse3 import FUSEError

from .config import (
    EPOCH_XATTR,
    MAX_EPOCH,
    PARTS_DIR,
    PID_XATTR,
    STATS_XATTR,
    XATTR_PREFIX,
    MountConfig,
    format_buffer,
)
from .costs import record_costs
from .errors import FormatError, ShuffleError, StaleSourceError
from .formats import Format, resolve_format
from .index import IndexCache, RecordIndex, SourceStamp
from .indexer import default_builder
from .layout import HEADER, TRAILER, Layout
from .prefetch import SharedTasks, Slot, WindowCache
from . import resolve
from .stats import Stats
from .stats import fit as fit_stats
from .pool_table import PoolEntry, PoolTable
from .pooled import PooledIndex
from .formats.npy import share_frame
from .stage import Stage, StagedSource
from .staging import EpochBytes, StageStore, StageTarget
from .strategies import Plan, make_plan
from .strategies.base import FEW_BLOCKS
from .strategies.exchange import Partitions
from .strategies.partial_local import pls_exchange
from .strategies.slices import SlicePlan, slice_edges
from .plan_memory import PlanMemory, plan_estimate, plan_nbytes
from .view import PoolSource, Source, SourceFile, View, window_work

log = logging.getLogger("shufflefs")

ROOT = pyfuse3.ROOT_INODE
META_TIMEOUT = 1.0
"""Seconds the kernel may cache attributes and non-view entries (the source tree rarely changes)."""
VIEW_BLKSIZE = 1 << 20
"""``st_blksize`` of views: stdio and Python size their reads by it; FUSE requests max out at 1 MiB."""
IDLE_VIEWS = 4
"""Views kept open (with their plan and cached windows) after their last handle closed, so that
readers that open the file for every record do not rebuild the plan and reload windows."""
RECENT_FILES = IDLE_VIEWS
"""Files opened most recently whose window 0 is loaded ahead when their epoch changes: at most
as many as idle views are kept (a prepared view waits there for its first open)."""
COST_FILES = IDLE_VIEWS
"""Files whose ``--balance-field`` costs (4 bytes per record) are kept for the next epoch's plan."""
POOL_STREAMS = IDLE_VIEWS
"""Pools' streams (plans of the whole pool for an epoch and rank) kept for their shards' views."""
STAGE_TARGETS = 64
"""Staged files whose exchange (O(blocks) each) is kept for their next epochs' views."""
INDEX_MEMO_BOUNDS = 32 << 20
"""Record boundaries (8 bytes each) of recently used indexes kept in memory besides the disk cache."""

PAGE_CACHE_FORMATS = frozenset({"npy", "fixed"})
"""Formats served through the page cache, because their usual readers map them (``numpy.load(...,
mmap_mode='r')``, ``numpy.memmap``) and a shared mmap of a direct_io file fails with ENODEV.  Safe
because a view inode's bytes never change; every other view uses direct_io (faster here)."""

X_EPOCH, X_STATS, X_PID = EPOCH_XATTR.encode(), STATS_XATTR.encode(), PID_XATTR.encode()
VIEW_ATTRS = [X_EPOCH] + [
    (XATTR_PREFIX + n).encode()
    for n in ("strategy", "seed", "records", "windows", "format", "block_size", "buffer", "info")
]
ROOT_ATTRS = [X_EPOCH, X_STATS, X_PID]
OURS = frozenset(VIEW_ATTRS + ROOT_ATTRS)

DIR, FILE, LINK, VIEW = "dir", "file", "link", "view"
MAX_PARTS = 4096
ROLE_PARTS, ROLE_COUNT = "parts", "count"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC


# --------------------------------------------------------------------------- small pieces


class Node:
    """One inode.  ``lookups`` is the kernel's reference count (lookup/readdir minus forget)."""

    __slots__ = (
        "ino", "kind", "relpath", "key", "lookups", "st", "target", "fmt", "epoch", "stamp", "size",
        "plan", "layout", "index", "view", "opens", "broken", "part", "parts", "role", "pool", "frame",
    )

    def __init__(self, ino: int, kind: str, relpath: str, key: tuple, st: os.stat_result) -> None:
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
        self.broken: ShuffleError | None = None
        # loader parts: the node shows the ``part``-th of ``parts`` pieces of the rank's share
        self.part, self.parts = 0, 1
        self.role: str | None = None  # ROLE_PARTS or ROLE_COUNT for the directories naming a split
        # a shard of a pool: shows a stretch of the pool's stream, framed by its own header/trailer
        self.pool: PoolEntry | None = None
        self.frame: tuple[bytes, bytes] | None = None

    @property
    def epoch_path(self) -> str:
        """The file whose epoch this node follows: a pool's shards all follow its first member."""
        return self.pool.pool.members[0] if self.pool is not None else self.relpath


class Probe:
    """What a directory entry is, gathered on a worker thread (lstat, last byte, link target)."""

    __slots__ = ("name", "st", "fmt", "last_byte", "target")

    def __init__(self, name: str, st: os.stat_result, fmt: Format | None, last_byte: int | None, target: str | None):
        self.name, self.st, self.fmt, self.last_byte, self.target = name, st, fmt, last_byte, target


class WindowRef(NamedTuple):
    """A view's window as the window cache knows it (`ShuffleFS._window`)."""

    key: Hashable
    nbytes: int
    shift: int
    loader: Callable
    work: int  # bytes the load works with besides the window


class ViewClosed(OSError):
    """A load asked of a view that is closing (a shard's view closed while its stream is read)."""

    def __init__(self) -> None:
        super().__init__(errno.EBADF, "view closed")


class SharedView:
    """A `View` whose file descriptor is closed only once no worker thread is loading from it."""

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


class Handle:
    """An open file.  For views: the window it reads now (``slot``, held in the window cache),
    which sits at view bytes ``[lo, hi)``, and where its last read ended."""

    __slots__ = ("node", "fd", "last_end", "slot", "k", "lo", "hi", "shift")

    def __init__(self, node: Node, fd: int = -1) -> None:
        self.node, self.fd, self.last_end = node, fd, 0
        self.slot: Slot | None = None
        self.k = -1  # the view window ``slot`` holds
        self.lo, self.hi = 0, -1  # no window: no read is inside it
        self.shift = 0  # view byte ``lo`` is byte ``shift`` of the slot (a shard's stretch of a stream window)


def _load_stream(views: list[SharedView], k: int, ahead: bool, stream: Plan,
                 out: np.ndarray, scratch: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Blocking: window k of a pool's stream, through any open view of the stream.  The window is
    shared by the stream's shards, so the shard whose read started the load may close its view
    (its last handle closed, or idle views were trimmed) while another shard waits for it."""
    for view in tuple(views):  # a copy: the list changes in the trio thread
        try:
            return view.load(k, out, scratch, ahead, stream)
        except ViewClosed:
            continue
    raise ViewClosed()


def view_mtime_ns(source_mtime_ns: int, epoch: int) -> int:
    """A view's mtime: its source's plus one second per epoch.  Readers that cache by path, size
    and mtime (Hugging Face ``datasets``) then see every epoch as a new file instead of serving
    epoch 0's order again; a function of the source and the epoch only, so every rank and every
    remount shows the same value."""
    return source_mtime_ns + epoch * 1_000_000_000


def parse_epoch(value: bytes) -> int:
    """ASCII decimal in [0, MAX_EPOCH], surrounding whitespace allowed; anything else is EINVAL."""
    try:
        text = value.decode("ascii").strip()
    except UnicodeDecodeError:
        raise FUSEError(errno.EINVAL) from None
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) > MAX_EPOCH:
        raise FUSEError(errno.EINVAL)
    return int(text)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _pread_full(fd: int, size: int, off: int) -> bytes:
    """Exactly ``size`` bytes unless EOF comes first (FUSE pads short replies with zeros)."""
    parts = []
    while size > 0:
        b = os.pread(fd, size, off)
        if not b:
            break
        parts.append(b)
        size -= len(b)
        off += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _guard(fn: Callable) -> Callable:
    """Unexpected exceptions become EIO (pyfuse3 would otherwise stop the whole mount)."""

    @functools.wraps(fn)
    async def wrapper(self: "ShuffleFS", *args: Any) -> Any:
        try:
            return await fn(self, *args)
        except (FUSEError, trio.Cancelled):
            raise
        except Exception as e:  # noqa: BLE001 -- logged and counted, never swallowed silently
            log.exception("%s failed", fn.__name__)
            self.stats.error(f"{fn.__name__}: internal error: {e!r}")
            raise FUSEError(errno.EIO) from None

    return wrapper


def _erofs(fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def refuse(self: "ShuffleFS", *args: Any) -> Any:
        raise FUSEError(errno.EROFS)

    return refuse


# --------------------------------------------------------------------------- the filesystem


class ShuffleFS(pyfuse3.Operations):
    """The operations of one mount.  Call `start` with a nursery before serving requests."""

    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, config: MountConfig) -> None:
        super().__init__()
        self.config = config
        self.source = os.path.abspath(os.fspath(config.source))
        self.real_source = os.path.realpath(self.source)
        self.mountpoint = os.path.abspath(os.fspath(config.mountpoint))
        self.spec = config.spec
        self.epoch = int(config.epoch)
        self.file_epochs: dict[str, int] = {}
        self.dir_epochs: dict[str, int] = {}
        self.index_cache = IndexCache(config.cache_dir)
        self.stats = Stats()

        self.meta_limiter = trio.CapacityLimiter(8)
        self.index_limiter = trio.CapacityLimiter(2)
        self.plan_limiter = trio.CapacityLimiter(1)
        """Plans are built one at a time: a record-level plan's build takes several times its size
        for a moment (``window``: 20 bytes per record); two at once under epoch churn peaked at
        1.09 of the memory bound."""
        self.windows = WindowCache(trio.CapacityLimiter(max(2, min(4, os.cpu_count() or 2))))
        self.plan_memory = PlanMemory()
        self.tasks = SharedTasks()

        self._nodes: dict[int, Node] = {}
        self._keys: dict[tuple, int] = {}
        self._next_ino = ROOT + 1
        self._handles: dict[int, Handle] = {}
        self._dirs: dict[int, tuple[str, list[Probe], tuple[int, int]]] = {}
        self._next_fh = 1
        self._formats: dict[str, Format | None] = {}
        self._indexes: OrderedDict[tuple, RecordIndex] = OrderedDict()
        self._bad_indexes: OrderedDict[tuple, FormatError] = OrderedDict()
        self._open_views: set[int] = set()
        self._idle: OrderedDict[int, Node] = OrderedDict()
        self._costs: OrderedDict[tuple[str, SourceStamp], np.ndarray] = OrderedDict()  # --balance-field
        self._recent: OrderedDict[tuple[str, int, int], None] = OrderedDict()  # (relpath, part, parts), newest last
        self.pools = PoolTable(self.source, self._format_key, config.pool_globs) if config.pool else None
        self._pool_plans: OrderedDict[tuple, Plan] = OrderedDict()  # the pooled streams shards cut up
        self._pool_sources: dict[tuple, PoolSource] = {}
        self._owners: dict[Hashable, list[SharedView]] = {}  # open views of each window owner (see _owner)
        self.epoch_prefetches = 0
        self.read_bytes = EpochBytes()
        self.stages = StageStore(config.stage_dir, self.read_bytes) if config.stage_dir is not None else None
        self._stage_targets: OrderedDict[Hashable, StageTarget] = OrderedDict()
        self._preparing: set[tuple] = set()  # files whose next epoch's view is being prepared
        self.few_blocks: dict[str, int] = {}  # files with fewer than FEW_BLOCKS of a size the user set

        resolve.confine(self.source)  # every source path from here on resolves beneath it
        root_st = os.stat(self.source)
        root = Node(ROOT, DIR, "", ("d", ""), root_st)
        root.lookups = 1
        self._nodes[ROOT] = root
        self._keys[root.key] = ROOT

    def start(self, nursery: trio.Nursery) -> None:
        """Background window loads and stage builds run in ``nursery`` (cancelled at unmount)."""
        self.windows.nursery = nursery
        if self.stages is not None:
            self.stages.nursery = nursery

    def stopping(self) -> None:
        """The FUSE loop ended: background stage builds stop at their next chunk."""
        if self.stages is not None:
            self.stages.stop.set()

    def shutdown(self) -> None:
        """Close every source file and remove the stages; called once the FUSE loop has ended."""
        for fh in list(self._handles):
            self._release_handle(fh)
        for node in list(self._nodes.values()) + list(self._idle.values()):
            self._close_view(node)
        self.windows.clear()
        if self.stages is not None:
            self.stages.close()

    # ------------------------------------------------------------------ helpers

    async def _io(self, fn: Callable, *args: Any, limiter: trio.CapacityLimiter | None = None) -> Any:
        # abandoned when cancelled (only at unmount): a call stuck on a hung source must not
        # hold up the exit; its result is dropped
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter or self.meta_limiter,
                                             abandon_on_cancel=True)

    def _path(self, relpath: str) -> str:
        return os.path.join(self.source, relpath) if relpath else self.source

    def _node(self, ino: int) -> Node:
        node = self._nodes.get(ino)
        if node is None:
            raise FUSEError(errno.ESTALE)
        return node

    def _format(self, relpath: str) -> Format | None:
        if relpath not in self._formats:
            if len(self._formats) > 100_000:
                self._formats.clear()
            self._formats[relpath] = resolve_format(relpath, self.config.rules, self.config.format_defaults)
        return self._formats[relpath]

    def _format_key(self, relpath: str) -> str | None:
        """Files pool only with files of the same format and parameters."""
        fmt = self._format(relpath)
        return repr(fmt) if fmt is not None else None

    def epoch_of(self, relpath: str) -> int:
        """A file's own override, else the nearest directory's, else the mount's epoch."""
        if relpath in self.file_epochs:
            return self.file_epochs[relpath]
        d = relpath  # a directory's own setting first (then its parents')
        while d:
            if d in self.dir_epochs:
                return self.dir_epochs[d]
            d = os.path.dirname(d)
        return self.epoch

    def _link_target(self, relpath: str) -> str | None:
        """The target shown in the mount, or None when the link leaves the source tree.

        Plain relative targets are kept; absolute ones and ones with ``..`` are rewritten
        relative to the link's directory so that they resolve inside the mount.
        """
        path = self._path(relpath)
        target = resolve.readlink_beneath(path)
        real = os.path.realpath(path)
        if not _inside(real, self.real_source):
            return None
        if not os.path.isabs(target) and ".." not in target.split("/"):
            return target
        return os.path.relpath(real, os.path.realpath(os.path.dirname(path)))

    def _probe(self, relpath: str, name: str) -> Probe | None:
        """Blocking: describe one entry, or None if it is hidden (outside links, devices, ...)."""
        path = self._path(relpath)
        try:
            st = resolve.stat_path(path, follow_last=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):  # a directory on the way became a link
                log.warning("%s: a directory on its path is a symbolic link now; not followed", relpath)
                return None
            raise
        if stat.S_ISDIR(st.st_mode):
            return Probe(name, st, None, None, None)
        if stat.S_ISLNK(st.st_mode):
            target = self._link_target(relpath)
            return Probe(name, st, None, None, target) if target is not None else None
        if not stat.S_ISREG(st.st_mode):
            return None
        fmt = self._format(relpath)
        last = None
        if fmt is not None and st.st_size > 0:
            try:
                fd = resolve.open_path(path)
                try:
                    b = os.pread(fd, 1, st.st_size - 1)
                finally:
                    os.close(fd)
                last = b[0] if b else None
            except OSError:
                last = None  # unreadable: open will report the error
        return Probe(name, st, fmt, last, None)

    def _list(self, relpath: str) -> list[Probe]:
        """Blocking: the visible entries of a directory, sorted by name."""
        out = []
        names = sorted(resolve.list_dir(self._path(relpath)))
        for name in names:
            p = self._probe(os.path.join(relpath, name) if relpath else name, name)
            if p is not None:
                out.append(p)
        return out

    async def _entry(self, relpath: str, probe: Probe, space: tuple[int, int] = (0, 1)) -> Node:
        """The node for a probed entry (existing or new) in the tree of loader part ``space``
        (``(part, parts)``; ``(0, 1)`` is the mount's own tree); does not count a lookup."""
        st = probe.st
        suffix = () if space == (0, 1) else space
        if stat.S_ISDIR(st.st_mode):
            key: tuple = ("d", relpath, *suffix)
            kind = DIR
        elif stat.S_ISLNK(st.st_mode):
            key, kind = ("l", relpath, *suffix), LINK
        elif probe.fmt is None:
            key, kind = ("f", relpath, *suffix), FILE
        else:
            pool = None
            if self.pools is not None:
                pool = await self._io(self.pools.find, relpath, SourceStamp.of(st))
            version = pool.stamps if pool is not None else SourceStamp.of(st)
            epoch = self.epoch_of(pool.pool.members[0] if pool is not None else relpath)
            key, kind = ("v", relpath, epoch, version, *suffix), VIEW
        ino = self._keys.get(key)
        if ino is not None:
            node = self._nodes[ino]
            if kind != VIEW:
                node.st = st
                node.target = probe.target
            elif node.size < 0:  # another lookup is sizing it: no attributes before the size
                await self._plan(node)
            return node
        node = Node(self._next_ino, kind, relpath, key, st)
        self._next_ino += 1
        node.target = probe.target
        node.part, node.parts = space
        if kind == VIEW:
            node.fmt = probe.fmt
            node.epoch = key[2]
            node.stamp = SourceStamp.of(st)
            node.pool = pool
            if self.config.world > 1 or node.parts > 1 or pool is not None:
                node.size = -1  # set below from the plan: a rank sees only its share
            else:
                node.size = probe.fmt.view_size(st.st_size, probe.last_byte)
        self._nodes[node.ino] = node
        self._keys[key] = node.ino
        if kind == VIEW and node.size < 0:
            try:
                await self._plan(node)
            except BaseException:
                self._drop(node)
                raise
        return node

    def _drop(self, node: Node) -> None:
        if self._keys.get(node.key) == node.ino:
            del self._keys[node.key]
        self._nodes.pop(node.ino, None)
        if node.opens == 0:
            self._close_view(node)

    def _attrs(self, node: Node, st: os.stat_result | None = None) -> pyfuse3.EntryAttributes:
        st = st or node.st
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.st_mode = st.st_mode
        a.st_nlink = st.st_nlink
        a.st_uid = st.st_uid
        a.st_gid = st.st_gid
        a.st_rdev = 0
        if node.kind == VIEW:
            if node.size < 0:  # the kernel would take it for a broken inode (EIO, no log)
                raise RuntimeError(f"{node.relpath}: attributes asked before its size was known")
            a.st_size = node.size
            a.st_blksize = VIEW_BLKSIZE
            a.st_blocks = (node.size + 511) // 512
            a.entry_timeout = 0
        else:
            a.st_size = len(os.fsencode(node.target)) if node.kind == LINK and node.target else st.st_size
            a.st_blksize = st.st_blksize
            a.st_blocks = st.st_blocks
            a.entry_timeout = META_TIMEOUT
        a.attr_timeout = META_TIMEOUT
        a.st_atime_ns = st.st_atime_ns
        a.st_mtime_ns = view_mtime_ns(st.st_mtime_ns, node.epoch) if node.kind == VIEW else st.st_mtime_ns
        a.st_ctime_ns = st.st_ctime_ns
        return a

    def _fail(self, what: str, relpath: str, epoch: int, offset: int | None, e: BaseException) -> FUSEError:
        """Log and count an error a reader will see, and turn it into the errno it gets."""
        where = f" at view offset {offset}" if offset is not None else ""
        self.stats.error(f"{what} {relpath} (epoch {epoch}){where}: {e}")
        if isinstance(e, ShuffleError):
            return FUSEError(e.errno)
        if isinstance(e, FileNotFoundError):
            return FUSEError(errno.ESTALE)
        if isinstance(e, OSError) and e.errno:
            return FUSEError(e.errno)
        return FUSEError(errno.EIO)

    # ------------------------------------------------------------------ index, plan, view

    async def _index(self, node: Node) -> RecordIndex:
        """The node's file's index, or its pool's."""
        if node.pool is not None:
            return await self._pool_index(node.pool, node.fmt)
        return await self._file_index(node.relpath, node.stamp, node.fmt)

    def _memo(self, key: tuple, index: RecordIndex) -> None:
        self._indexes[key] = index
        while len(self._indexes) > 1 and sum(len(i.bounds) for i in self._indexes.values()) > INDEX_MEMO_BOUNDS:
            self._indexes.popitem(last=False)

    async def _pool_index(self, entry: PoolEntry, fmt: Format) -> PooledIndex:
        """The members' indexes (each built and cached like a single file's) joined in shard order."""
        pool = entry.pool
        key = ("pool", pool.key, pool.members, entry.stamps, repr(fmt))
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]

        async def build() -> PooledIndex:
            members: list[RecordIndex | None] = [None] * len(pool.members)

            async def one(i: int) -> None:
                members[i] = await self._file_index(pool.members[i], entry.stamps[i], fmt)

            async with trio.open_nursery() as nursery:
                for i in range(len(pool.members)):
                    nursery.start_soon(one, i)
            if fmt.name == "npy":
                await self._io(self._check_npy_pool, pool)
            index = await self._io(PooledIndex, members, limiter=self.index_limiter)
            log.info("pool %s: %d shards, %d records", pool.key, len(pool.members), index.n)
            self._memo(key, index)
            return index

        return await self.tasks.run(key, build)

    def _check_npy_pool(self, pool: Any) -> None:
        """Blocking: arrays pool only if their rows are alike (the shards' headers are rewritten)."""
        from .formats.npy import row_kind

        kinds = []
        for m in pool.members:
            path = self._path(m)
            with os.fdopen(resolve.open_path(path), "rb") as f:
                head = f.read(1 << 16)
            kinds.append((row_kind(head, path), path))
        for kind, path in kinds[1:]:
            if kind != kinds[0][0]:
                raise FormatError(path, 0, f"rows {kind} differ from those of {kinds[0][1]} {kinds[0][0]}; "
                                  "arrays pool only with rows of one dtype and shape (--no-pool shuffles each file alone)")

    async def _file_index(self, relpath: str, stamp: SourceStamp, fmt: Format) -> RecordIndex:
        """Built once per (file, stamp, format) even under concurrent opens; cached on disk."""
        key = (relpath, stamp, fmt.name, json.dumps(fmt.params(), sort_keys=True, default=str))
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]
        if key in self._bad_indexes:
            raise self._bad_indexes[key]
        path = self._path(relpath)

        async def build() -> RecordIndex:
            t0 = time.monotonic()
            try:
                # Scans run in a worker process: a source truncated under its mmap (SIGBUS) must
                # not end the daemon.  Cached indexes load here directly.
                builder = default_builder()
                index = await self._io(builder.build, path, fmt, self.index_cache.dir, limiter=self.index_limiter)
            except FormatError as e:
                self._bad_indexes[key] = e
                while len(self._bad_indexes) > 256:
                    self._bad_indexes.popitem(last=False)
                raise
            log.info("index of %s: %d records (%s) in %.3f s", relpath, index.n, fmt, time.monotonic() - t0)
            if index.stamp != stamp:
                raise StaleSourceError(path, None, "source changed since it was looked up; reopen it")
            self._memo(key, index)
            return index

        return await self.tasks.run(("index",) + key, build)

    async def _plan(self, node: Node) -> Plan:
        if node.plan is not None:
            return node.plan

        async def build() -> Plan:
            if node.plan is not None:
                return node.plan
            index = await self._index(node)
            file = ("pool", node.pool.pool.key) if node.pool is not None else ("file", node.relpath)
            need = 0 if node.pool is not None else plan_estimate(self.spec.strategy, self.spec.balance, index.n)
            await self.plan_memory.admit(node.ino, file, index.n, need, self._drop_a_plan, lambda: self.windows.landed)
            try:
                plan, layout = await self._plan_and_layout(node, index)
            except BaseException:
                self.plan_memory.release(node.ino)
                raise
            self._note_few_blocks(node, index)
            if node.size < 0:  # a rank's share or a shard: sized by its plan (a negative size
                node.size = layout.size  # reaching the kernel would make the inode bad: EIO)
            elif layout.size != node.size:
                self.plan_memory.release(node.ino)
                raise FormatError(
                    self._path(node.relpath), None,
                    f"view has {layout.size} bytes but {node.size} were announced; refusing to serve it",
                )
            node.index, node.layout = index, layout
            node.plan = plan
            self.plan_memory.charge(node.ino, file, index.n, plan_nbytes(plan))
            return plan

        return await self.tasks.run(("plan", node.ino), build)

    async def _plan_and_layout(self, node: Node, index: RecordIndex) -> tuple[Plan, Layout]:
        if node.pool is not None:
            return await self._shard_plan(node, index)
        if index.stamp != node.stamp:
            raise StaleSourceError(self._path(node.relpath), None, "source changed since it was looked up; reopen it")
        plan = await self._make_plan(node, index, (node.relpath, index.stamp))
        if node.fmt.name == "npy":  # a share of the rows needs a header that says so
            node.frame = await self._io(share_frame, self._path(node.relpath), index,
                                        int(np.asarray(plan.window_records).sum()))
        head, trail = (None, None) if node.frame is None else map(len, node.frame)
        return plan, await self._io(Layout, index, plan, head, trail, limiter=self.index_limiter)

    def _note_few_blocks(self, node: Node, index: RecordIndex) -> None:
        """A block size the user set that leaves a file (or pool) few blocks: say so once."""
        size = self.spec.block_size
        if size is None or self.spec.strategy not in ("block", "corgipile", "pls"):
            return
        name = node.pool.pool.key if node.pool is not None else node.relpath
        blocks = -(-index.data_bytes // size)
        if blocks >= FEW_BLOCKS or name in self.few_blocks:
            return
        if len(self.few_blocks) < 1000:
            self.few_blocks[name] = blocks
        log.warning("%s: %d block(s) of %d bytes: fewer than %d blocks, so block and corgipile barely shuffle it; "
                    "lower --block-size (or leave it automatic)", name, blocks, size, FEW_BLOCKS)

    async def _make_plan(self, node: Node, index: RecordIndex, cost_key: tuple) -> Plan:
        """`make_plan` on a worker thread, with the records' costs for ``--balance`` (kept per
        file or pool version under ``cost_key``)."""
        known = self._costs.get(cost_key)

        def plan() -> tuple[Plan, np.ndarray | None]:
            costs = known
            if costs is None and self.spec.balance:
                costs = self._record_costs(node, index)
            return make_plan(index, self.spec, node.epoch, self.config.rank, self.config.world,
                             node.part, node.parts, costs=costs), costs

        made, costs = await self._io(plan, limiter=self.plan_limiter)
        if costs is not None:
            self._costs[cost_key] = costs
            self._costs.move_to_end(cost_key)
            while len(self._costs) > COST_FILES:
                self._costs.popitem(last=False)
        return made

    def _record_costs(self, node: Node, index: RecordIndex) -> np.ndarray:
        """Blocking: every record's cost (a pool's: its members' in shard order)."""
        field, fmt = self.spec.balance_field, node.fmt.name
        if node.pool is None:
            return record_costs(self._path(node.relpath), index, field, fmt)
        members = node.pool.pool.members
        return np.concatenate([record_costs(self._path(m), index.member_index(i), field, fmt)
                               for i, m in enumerate(members)])

    async def _shard_plan(self, node: Node, index: PooledIndex) -> tuple[Plan, Layout]:
        """Shard i of a pool: the i-th stretch of the pool's stream (the rank's, or its part's),
        framed by the shard's own header and trailer."""
        entry = node.pool
        version = (entry.pool.key, entry.pool.members, entry.stamps)
        key = (*version, node.epoch, node.part, node.parts)
        stream = self._pool_plans.get(key)
        if stream is None:
            async def build() -> Plan:
                plan = await self._make_plan(node, index, version)
                self._pool_plans[key] = plan
                while len(self._pool_plans) > POOL_STREAMS:
                    self._pool_plans.popitem(last=False)
                return plan

            stream = await self.tasks.run(("stream", *key), build)
        else:
            self._pool_plans.move_to_end(key)

        def cut() -> tuple[Plan, tuple[bytes, bytes]]:
            shards = len(entry.pool.members)
            edges = slice_edges(int(np.asarray(stream.window_records).sum()), shards)
            lo, hi = int(edges[entry.shard]), int(edges[entry.shard + 1])
            return SlicePlan(stream, lo, hi, entry.shard, shards), self._shard_frame(node, index, hi - lo)

        plan, frame = await self._io(cut, limiter=self.index_limiter)
        node.frame = frame
        return plan, Layout(index, plan, len(frame[0]), len(frame[1]))

    def _shard_frame(self, node: Node, index: PooledIndex, records: int) -> tuple[bytes, bytes]:
        """Blocking: the header and trailer a shard shows, its own file's (an ``.npy`` header
        rewritten for the shard's row count)."""
        size, head, trail = index.member_frames[node.pool.shard]
        path = self._path(node.relpath)
        src = SourceFile(path, node.stamp)
        try:
            header, trailer = src.read_range(0, head), src.read_range(trail, size)
        finally:
            src.close()
        if node.fmt.name == "npy" and head:
            from .formats.npy import header_with_rows

            header = header_with_rows(header, records, path)
        return header, trailer

    def _pool_source(self, node: Node) -> PoolSource:
        """Blocking: a shard's pool's files, opened once for all its shards (one more user)."""
        entry = node.pool
        key = (entry.pool.key, entry.pool.members, entry.stamps)
        src = self._pool_sources.get(key)
        try:
            src = src.share() if src is not None else None
        except OSError:
            src = None
        if src is None:
            for k in [k for k, v in self._pool_sources.items() if v.closed]:
                del self._pool_sources[k]
            src = self._pool_sources[key] = PoolSource([self._path(m) for m in entry.pool.members], node.index)
        return src

    async def _stage_target(self, node: Node) -> StageTarget:
        """What a view's stages hold: its file's (or pool's) version, partitioned for this rank."""
        index, epoch_path = node.index, node.epoch_path
        if node.pool is not None:
            e = node.pool
            file, key, name = ("pool", e.pool.key), ("pool", e.pool.key, e.pool.members, e.stamps), e.pool.key
            paths = [self._path(m) for m in e.pool.members]
            open_source: Callable[[], Source] = lambda: PoolSource(paths, index)
        else:
            file, key, name = ("file", node.relpath), ("file", node.relpath, node.stamp), node.relpath
            path = self._path(node.relpath)
            open_source = lambda: SourceFile(path, index.stamp)
        target = self._stage_targets.get(key)
        if target is None:
            exchange = await self._io(pls_exchange, index, self.spec, self.config.world, limiter=self.index_limiter)
            target = StageTarget(file, key, name, index, Partitions(exchange, self.config.rank), open_source,
                                 lambda: self.epoch_of(epoch_path))
            self._stage_targets[key] = target
            while len(self._stage_targets) > STAGE_TARGETS:
                self._stage_targets.popitem(last=False)
        self._stage_targets.move_to_end(key)
        return target

    def _new_view(self, node: Node, plan: Plan, stage: Stage | None) -> View:
        """Blocking: the node's view over its source (its pool's files, shared, for a shard),
        with its epoch's ``stage`` in front when staging (released when the view closes, or now
        if it cannot be made)."""
        path = self._path(node.relpath)
        try:
            source: Source = self._pool_source(node) if node.pool is not None else SourceFile(path, node.index.stamp)
        except BaseException:
            if stage is not None:
                self.stages.release(stage)
            raise
        if stage is not None:  # the view's source now releases the stage when it closes
            source = StagedSource(source, stage, functools.partial(self.stages.release, stage))
        try:
            return View(path, node.index, plan, source, node.frame, meter=self.read_bytes.meter(node.epoch),
                        check=node.fmt.window_check() if self.config.verify == "frames" else None)
        except BaseException:
            source.close()
            raise

    async def _open_view(self, node: Node) -> None:
        """Make ``node.view`` usable for one more handle (counted in ``node.opens``)."""
        node.opens += 1
        try:
            if node.broken is not None:
                raise node.broken
            self._idle.pop(node.ino, None)
            if node.view is None:
                await self.tasks.run(("view", node.ino), functools.partial(self._make_view, node))
        except BaseException:
            node.opens -= 1
            if node.opens == 0:
                self._close_view(node)
            raise

    async def _make_view(self, node: Node) -> None:
        if node.view is not None:
            return
        plan = await self._plan(node)
        stage = None
        if self.stages is not None:
            stage = await self.stages.acquire(await self._stage_target(node), node.epoch)
        view = await self._io(self._new_view, node, plan, stage, limiter=self.index_limiter)
        if node.opens == 0:  # every opener gave up meanwhile
            view.close()
            return
        node.view = SharedView(view)
        self._open_views.add(node.ino)
        self._reserve(node)
        log.debug(
            "view %s epoch %d: %d records, %d windows, %d bytes", node.relpath, node.epoch,
            node.index.n, plan.n_windows, node.layout.size,
        )

    def _reserve(self, node: Node) -> None:
        """Let the view's windows load; its largest window counts in the memory limit."""
        owner = self._owner(node)
        plan = node.plan.inner if node.pool is not None else node.plan
        sizes = np.asarray(plan.window_sizes)
        self._owners.setdefault(owner, []).append(node.view)
        self.windows.register(owner, int(sizes.max()) if len(sizes) else 0, window_work(plan))

    def _retire(self, node: Node) -> None:
        """The last handle closed: keep the view idle (LRU) unless it can never be read again."""
        if node.view is None or node.broken is not None or node.ino not in self._nodes:
            self._close_view(node)
            if node.lookups <= 0:
                self._drop(node)
            return
        self._idle[node.ino] = node  # its windows stay while memory allows
        self._idle.move_to_end(node.ino)
        while len(self._idle) > IDLE_VIEWS:
            _, oldest = self._idle.popitem(last=False)
            self._close_view(oldest)
            if oldest.lookups <= 0:  # prepared at an epoch change, never opened: forget it
                self._drop(oldest)

    def _exchange_counts(self) -> dict[str, str]:
        """pls: what each view of the current epoch with a plan kept and received this epoch."""
        out = {}
        for node in self._nodes.values():
            if node.kind == VIEW and node.plan is not None and node.parts == 1 \
                    and node.epoch == self.epoch_of(node.epoch_path):
                d = node.plan.describe()
                out[node.relpath] = (f"epoch {node.epoch}: kept {d['kept']} received {d['received']} "
                                     f"sent {d['sent']} of {d['partition_records']}")
        return dict(sorted(out.items()))

    def _close_stale(self) -> None:
        """Close the idle views of epochs that are no longer current: their names now lead to
        the new epoch's views, so they can never be opened again, and their plans and windows
        would otherwise share the memory with the new epoch's while it is being prepared."""
        for node in [n for n in self._idle.values() if n.epoch != self.epoch_of(n.epoch_path)]:
            self._close_view(node)
            if node.lookups <= 0:
                self._drop(node)

    def _close_view(self, node: Node) -> None:
        """Close the source file and forget the plan (rebuilt cheaply; the index stays in the memo)."""
        self._idle.pop(node.ino, None)
        if node.view is not None:
            node.view.close()
            owner = self._owner(node)
            views = self._owners[owner]
            views.remove(node.view)
            node.view = None
            self._open_views.discard(node.ino)
            if not views:
                del self._owners[owner]
                self.windows.unregister(owner)
            if self.stages is not None:
                self.stages.tidy()
        node.plan = node.layout = node.index = node.frame = None
        self.plan_memory.release(node.ino)

    def _drop_a_plan(self) -> bool:
        """Close the view (and plan) least recently planned that no handle has open, to make room
        for another plan; False if there is none (see `plan_memory`)."""
        for ino in self.plan_memory.holders():
            node = self._nodes.get(ino)
            if node is None:  # forgotten meanwhile
                self.plan_memory.release(ino)
                return True
            if node.plan is not None and node.opens == 0 and not self.tasks.running(("view", ino)):
                self._close_view(node)
                if node.lookups <= 0:
                    self._drop(node)
                return True
        return False

    @staticmethod
    def _owner(node: Node) -> Hashable:
        """Whose windows a view reads: its own, or for a pool's shard its pool stream's, which all
        the shards of that stream share (a window is loaded once however the shards cut it)."""
        if node.pool is None:
            return node.ino
        e = node.pool
        return ("stream", e.pool.key, e.pool.members, e.stamps, node.epoch, node.part, node.parts)

    def _window(self, node: Node, k: int, ahead: bool = False) -> WindowRef:
        """View window k as the window cache knows it; its bytes start ``shift`` bytes into the
        cached window (a shard's stretch of a stream window).  The loader builds it; ``ahead`` (a
        sequential reader): then hints the next window's blocks."""
        view = node.view
        if node.pool is None:
            return WindowRef((node.ino, k), node.layout.window_size(k), 0,
                             lambda out, scratch: view.load(k, out, scratch, ahead), window_work(node.plan, k))
        stream = node.plan.inner
        kin, shift = node.plan.stream_window(k)
        owner = self._owner(node)
        return WindowRef((owner, kin), int(stream.window_sizes[kin]), shift, functools.partial(
            _load_stream, self._owners[owner], kin, ahead, stream), window_work(stream, kin))

    # ------------------------------------------------------------------ tree

    @_guard
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if parent.kind != DIR:
            raise FUSEError(errno.ENOTDIR)
        sname = os.fsdecode(name)
        if sname == ".":
            node = parent
        elif sname == "..":
            ino = self._keys.get(self._up_key(parent))
            if ino is None:
                raise FUSEError(errno.ENOENT)
            node = self._nodes[ino]
        elif parent.role is not None or (parent.ino == ROOT and sname == PARTS_DIR):
            node = self._split_dir(parent, sname)
        else:
            relpath = os.path.join(parent.relpath, sname) if parent.relpath else sname
            probe = await self._io(self._probe, relpath, sname)
            if probe is None:
                raise FUSEError(errno.ENOENT)
            try:
                node = await self._entry(relpath, probe, (parent.part, parent.parts))
            except (ShuffleError, OSError) as e:
                raise self._fail("lookup", relpath, self.epoch_of(relpath), None, e) from None
        node.lookups += 1
        return self._attrs(node)

    def _up_key(self, node: Node) -> tuple:
        """The key of a directory's parent (the split directories lead back to the root)."""
        if node.role == ROLE_PARTS:
            return ("d", "")
        if node.role == ROLE_COUNT:
            return ("P",)
        suffix = () if node.parts == 1 else (node.part, node.parts)
        if node.relpath == "" and node.parts > 1:
            return ("P", node.parts)
        return ("d", os.path.dirname(node.relpath), *suffix)

    def _split_dir(self, parent: Node, name: str) -> Node:
        """``.parts``, ``.parts/K`` and ``.parts/K/i`` (the root of part i's tree): made on
        lookup; ``.parts`` and ``.parts/K`` list nothing (any K up to `MAX_PARTS` exists)."""
        if parent.role is None:
            key, role, space = ("P",), ROLE_PARTS, (0, 1)
        else:
            if not re.fullmatch(r"[1-9][0-9]{0,4}|0", name):
                raise FUSEError(errno.ENOENT)
            k = int(name)
            if parent.role == ROLE_PARTS:
                if not 1 <= k <= MAX_PARTS:
                    raise FUSEError(errno.ENOENT)
                key, role, space = ("P", k), ROLE_COUNT, (0, k)
            else:
                if k >= parent.parts:
                    raise FUSEError(errno.ENOENT)
                key, role, space = ("d", "", k, parent.parts), None, (k, parent.parts)
        ino = self._keys.get(key)
        if ino is not None:
            return self._nodes[ino]
        node = Node(self._next_ino, DIR, "", key, self._nodes[ROOT].st)
        self._next_ino += 1
        node.role = role
        node.part, node.parts = space
        self._nodes[node.ino] = node
        self._keys[key] = node.ino
        return node

    @_guard
    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            node = self._nodes.get(ino)
            if node is None or ino == ROOT:
                continue
            node.lookups -= n
            if node.lookups <= 0 and ino not in self._idle:
                # an idle view keeps its node (and key) until it leaves the idle ones: the kernel
                # forgets an inode it looked up while revalidating a name, then looks it up again
                self._drop(node)

    @_guard
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if node.kind == VIEW:
            return self._attrs(node)
        try:
            st = await self._io(resolve.stat_path, self._path(node.relpath), node.ino == ROOT)
        except (FileNotFoundError, NotADirectoryError):
            raise FUSEError(errno.ENOENT) from None
        except OSError as e:
            raise FUSEError(errno.ESTALE if e.errno in (errno.ELOOP, errno.EXDEV) else e.errno or errno.EIO) from None
        node.st = st
        return self._attrs(node, st)

    @_guard
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        node = self._node(inode)
        if node.kind != LINK:
            raise FUSEError(errno.EINVAL)
        target = await self._io(self._link_target, node.relpath)
        if target is None:
            raise FUSEError(errno.ENOENT)
        return os.fsencode(target)

    @_guard
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self._node(inode)
        if node.kind != DIR:
            raise FUSEError(errno.ENOTDIR)
        try:
            entries = [] if node.role is not None else await self._io(self._list, node.relpath)
        except OSError as e:
            raise FUSEError(e.errno or errno.EIO) from None
        fh = self._next_fh
        self._next_fh += 1
        self._dirs[fh] = (node.relpath, entries, (node.part, node.parts))
        return fh

    @_guard
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        parent, entries, space = self._dirs[fh]
        for i in range(start_id, len(entries)):
            probe = entries[i]
            relpath = os.path.join(parent, probe.name) if parent else probe.name
            try:
                node = await self._entry(relpath, probe, space)
            except (ShuffleError, OSError):
                continue  # listed only if its size is known (world > 1); the error is logged at open
            if not pyfuse3.readdir_reply(token, os.fsencode(probe.name), self._attrs(node), i + 1):
                if node.lookups == 0:
                    self._drop(node)
                return
            node.lookups += 1

    @_guard
    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    @_guard
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        sv = await self._io(os.statvfs, self.source)
        d = pyfuse3.StatvfsData()
        d.f_bsize, d.f_frsize = sv.f_bsize, sv.f_frsize
        d.f_blocks, d.f_bfree, d.f_bavail = sv.f_blocks, sv.f_bfree, sv.f_bavail
        d.f_files, d.f_ffree, d.f_favail = sv.f_files, sv.f_ffree, sv.f_favail
        d.f_namemax = sv.f_namemax
        return d

    # ------------------------------------------------------------------ files

    @_guard
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if flags & _WRITE_FLAGS:
            raise FUSEError(errno.EROFS)
        if node.kind == DIR:
            raise FUSEError(errno.EISDIR)
        if node.kind == LINK:
            raise FUSEError(errno.ELOOP)
        if node.kind == FILE:
            try:
                fd = await self._io(resolve.open_path, self._path(node.relpath))
            except OSError as e:
                raise FUSEError(e.errno or errno.EIO) from None
            fh = self._new_handle(Handle(node, fd))
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=False)
        try:
            await self._open_view(node)
        except (ShuffleError, OSError) as e:
            raise self._fail("open", node.relpath, node.epoch, None, e) from None
        self.stats.files_opened += 1
        recent = (node.relpath, node.part, node.parts)
        self._recent[recent] = None
        self._recent.move_to_end(recent)
        while len(self._recent) > RECENT_FILES:
            self._recent.popitem(last=False)
        fh = self._new_handle(Handle(node))
        page_cache = node.fmt.name in PAGE_CACHE_FORMATS
        return pyfuse3.FileInfo(fh=fh, direct_io=not page_cache, keep_cache=page_cache)

    def _new_handle(self, h: Handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = h
        return fh

    @_guard
    async def read(self, fh: int, off: int, size: int) -> Any:
        h = self._handles.get(fh)
        if h is None:
            raise FUSEError(errno.EBADF)
        node = h.node
        if node.kind == FILE:
            try:
                data = await self._io(_pread_full, h.fd, size, off, limiter=self.windows.limiter)
            except OSError as e:
                raise self._fail("read", node.relpath, node.epoch, off, e) from None
            self.stats.served(len(data))
            return data
        if node.broken is not None:
            raise FUSEError(node.broken.errno)
        try:
            if h.lo <= off and off + size <= h.hi and h.slot.data is not None:
                # inside the window this handle is reading (held: loaded, and its bytes are only
                # taken away by a read that needed the memory, which also clears ``data``)
                at = off - h.lo + h.shift
                data = memoryview(h.slot.data)[at: at + size]
                h.slot.used = trio.current_time()  # still read: not idle (see WindowCache.room)
            else:
                data = await self._read_view(h, off, size)
            node.view.view.source.verify_open()  # never serve bytes of a source that changed
        except (ShuffleError, OSError) as e:
            if isinstance(e, StaleSourceError):
                node.broken = e
            raise self._fail("read", node.relpath, node.epoch, off, e) from None
        n = len(data)
        self.stats.served(n)
        h.last_end = off + n
        return data

    async def _read_view(self, h: Handle, off: int, size: int) -> Any:
        """The bytes of ``[off, off+size)``, when they are not all in the handle's window.

        A read takes its windows one at a time, and a handle lets go of its window before it
        waits for another: so a handle never needs more than one window of the memory limit, and
        readers of more views than fit take turns instead of waiting for each other (a read across
        a window boundary copies the first window's tail before it asks for the next)."""
        node = h.node
        pieces = node.layout.pieces(off, size)
        if not pieces:
            return b""
        view = node.view.view
        sequential = off == h.last_end
        out: bytearray | None = bytearray(sum(p.hi - p.lo for p in pieces)) if len(pieces) > 1 else None
        pos, entered, data = 0, False, None
        for p in pieces:
            if p.part == HEADER:
                data = memoryview(view.header)[p.lo: p.hi]
            elif p.part == TRAILER:
                data = memoryview(view.trailer)[p.lo: p.hi]
            else:
                ref = self._window(node, p.part, sequential)
                if h.slot is not None and h.slot.key != ref.key:
                    self._leave(h)
                slot = await self.windows.acquire(ref.key, ref.nbytes, ref.loader, ref.work)
                try:
                    entered = self._hold(h, p.part, slot, ref.shift) or entered
                    data = memoryview(slot.data)[p.lo + ref.shift: p.hi + ref.shift]
                    if out is not None:
                        out[pos: pos + len(data)] = data
                finally:
                    self.windows.release(slot)
            if out is not None and p.part in (HEADER, TRAILER):
                out[pos: pos + len(data)] = data
            pos += p.hi - p.lo
        if entered and sequential and h.slot is not None:
            self._prefetch(node, h.k + 1)
        return data if out is None else out

    def _hold(self, h: Handle, k: int, slot: Slot, shift: int = 0) -> bool:
        """``h`` now reads window k (starting ``shift`` bytes into ``slot``): hold it for the
        handle, letting go of the previous one.  True if that is a window change (a sequential
        reader then prefetches the next one, once the read's pins are gone, so that the window
        left behind can make room)."""
        if h.slot is slot:
            return False
        self._leave(h)
        self.windows.hold(slot)
        starts = h.node.layout.window_starts
        h.slot, h.k, h.lo, h.hi, h.shift = slot, k, int(starts[k]), int(starts[k + 1]), shift
        return True

    def _prefetch(self, node: Node, k: int) -> None:
        if k < node.layout.n_windows:
            ref = self._window(node, k, ahead=True)
            self.windows.prefetch(ref.key, ref.nbytes, ref.loader, ref.work)

    def _leave(self, h: Handle) -> None:
        if h.slot is not None:
            self.windows.unhold(h.slot)
            h.slot, h.k, h.lo, h.hi, h.shift = None, -1, 0, -1, 0

    @_guard
    async def flush(self, fh: int) -> None:
        return None

    @_guard
    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    @_guard
    async def release(self, fh: int) -> None:
        self._release_handle(fh)

    def _release_handle(self, fh: int) -> None:
        h = self._handles.pop(fh, None)
        if h is None:
            return
        node = h.node
        if node.kind == FILE:
            os.close(h.fd)
            return
        self._leave(h)
        node.opens -= 1
        if node.opens == 0:
            self._retire(node)

    # ------------------------------------------------------------------ extended attributes

    def _xattr_names(self, node: Node) -> list[bytes]:
        if node.ino == ROOT:
            return list(ROOT_ATTRS)
        if node.kind == DIR:
            return [X_EPOCH]
        if node.kind == VIEW:
            return list(VIEW_ATTRS)
        return []

    @_guard
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return self._xattr_names(self._node(inode))

    @_guard
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        node = self._node(inode)
        if name not in self._xattr_names(node):
            raise FUSEError(pyfuse3.ENOATTR)
        if name == X_EPOCH:
            if node.kind == DIR and node.relpath == "":
                return str(self.epoch).encode()
            if node.kind == DIR:
                return str(self.epoch_of(node.relpath)).encode()
            return str(node.epoch).encode()
        if name == X_PID:
            return str(os.getpid()).encode()
        if name == X_STATS:
            return fit_stats(self.describe())
        field = name.decode()[len(XATTR_PREFIX):]
        simple = {
            "strategy": self.spec.strategy,
            "seed": self.spec.seed,
            "format": node.fmt.name,
            "buffer": format_buffer(self.spec.buffer),
        }
        if field in simple:
            return str(simple[field]).encode()
        try:
            plan = await self._plan(node)
        except (ShuffleError, OSError) as e:
            raise self._fail("getxattr", node.relpath, node.epoch, None, e) from None
        if field == "records":  # the records this view holds (a rank's or a part's share)
            return str(int(plan.window_records.sum())).encode()
        if field == "windows":
            return str(plan.n_windows).encode()
        if field == "block_size":  # the file's own when automatic
            return str(plan.spec.block_size).encode()
        info = {
            **plan.describe(),
            "path": node.relpath,
            "view_records": int(plan.window_records.sum()),
            "format": node.fmt.name,
            "format_params": node.fmt.params(),
            "block_size": plan.spec.block_size,
            "block_size_auto": self.spec.block_size is None,
            "buffer": format_buffer(self.spec.buffer),
            "source_size": node.stamp.size,
            "view_size": node.size,
        }
        if node.pool is not None:
            info.update(pool=node.pool.pool.key, pool_shards=len(node.pool.pool.members),
                        pool_declared=node.pool.pool.declared)
        return json.dumps(info, sort_keys=True, default=str).encode()

    @_guard
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        node = self._node(inode)
        if name != X_EPOCH:
            raise FUSEError(errno.EPERM if name in OURS else errno.EROFS)
        epoch = parse_epoch(value)
        if node.kind == DIR and node.relpath == "":  # the root, or a part tree's root
            self.epoch = epoch
            self.file_epochs.clear()
            self.dir_epochs.clear()
            log.info("epoch of every file set to %d", epoch)
        elif node.kind == DIR:
            prefix = node.relpath + "/"
            for d in (self.file_epochs, self.dir_epochs):
                for p in [p for p in d if p.startswith(prefix)]:
                    del d[p]
            self.dir_epochs[node.relpath] = epoch
            log.info("epoch of files under %s set to %d", node.relpath, epoch)
        elif node.kind == VIEW and node.pool is not None:  # a pool's shards share its epoch
            for m in node.pool.pool.members:
                self.file_epochs[m] = epoch
            log.info("epoch of the pool %s set to %d", node.pool.pool.key, epoch)
        elif node.kind == VIEW:
            self.file_epochs[node.relpath] = epoch
            log.info("epoch of %s set to %d", node.relpath, epoch)
        else:
            raise FUSEError(errno.ENOTSUP)
        self._close_stale()
        if self.stages is not None:
            self.stages.tidy()
        prefix = node.relpath + "/" if node.kind == DIR else None
        everything = node.kind == DIR and node.relpath == ""
        for relpath, part, parts in reversed(self._recent):  # newest first
            if everything or relpath == node.relpath or (prefix and relpath.startswith(prefix)) \
                    or (node.pool is not None and relpath in node.pool.pool.members):
                if self.windows.nursery is not None:
                    self.windows.nursery.start_soon(self._prepare, relpath, (part, parts))

    async def _prepare(self, relpath: str, space: tuple[int, int] = (0, 1)) -> None:
        """Prepare the current epoch's view of ``relpath`` (`_prepare_once`), one at a time per
        file: epoch changes faster than plans are built start no more work, the running
        preparation repeats once for the epoch that is current when it ends.  (Without this a
        storm of epoch changes queued a plan per epoch, each held until its view was made.)"""
        key = (relpath, *space)
        if key in self._preparing:
            return
        self._preparing.add(key)
        try:
            while True:
                epoch = self.epoch_of(relpath)
                await self._prepare_once(relpath, space)
                if self.epoch_of(relpath) == epoch:
                    return
        finally:
            self._preparing.discard(key)

    async def _prepare_once(self, relpath: str, space: tuple[int, int]) -> None:
        """Open the current epoch's view of ``relpath`` without a handle and load its window 0,
        so that the first read after an epoch change finds it ready (the view then waits among
        the idle ones).  Failures are left for the open to report."""
        try:
            probe = await self._io(self._probe, relpath, os.path.basename(relpath))
            if probe is None or probe.fmt is None:
                return
            node = await self._entry(relpath, probe, space)
            if node.kind != VIEW or node.broken is not None:
                return
            node.opens += 1  # keeps the view from closing while it is being made
            try:
                if node.view is None:
                    await self.tasks.run(("view", node.ino), functools.partial(self._make_view, node))
                if node.view is not None and node.layout.n_windows:
                    ref = self._window(node, 0, ahead=True)
                    self.epoch_prefetches += self.windows.prefetch(ref.key, ref.nbytes, ref.loader, ref.work)
            finally:
                node.opens -= 1
                if node.opens == 0:
                    self._retire(node)  # idle until its first open (or forgotten if it failed)
        except (ShuffleError, OSError) as e:
            log.debug("preparing %s for the new epoch: %s", relpath, e)
        except Exception:  # noqa: BLE001 -- a background task must never end the mount
            log.exception("preparing %s for the new epoch failed", relpath)

    @_guard
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        node = self._node(inode)
        if name in self._xattr_names(node):
            raise FUSEError(errno.EPERM)
        raise FUSEError(pyfuse3.ENOATTR)

    def describe(self) -> dict[str, Any]:
        """The mount's state for ``user.shufflefs.stats`` (and `shufflefs stat`)."""
        return self.stats.snapshot(
            source=self.source,
            mountpoint=self.mountpoint,
            strategy=self.spec.strategy,
            seed=self.spec.seed,
            block_size="auto" if self.spec.block_size is None else self.spec.block_size,
            few_blocks=dict(self.few_blocks),
            buffer=format_buffer(self.spec.buffer),
            page_size=self.spec.page_size,
            rank=self.config.rank,
            world=self.config.world,
            even=self.spec.even,
            exchange=self.spec.exchange,
            **({"pls_exchange": self._exchange_counts(), "pls_local": self.spec.pls_local}
               if self.spec.strategy == "pls" else {}),
            pooling=self.pools is not None,
            pool_globs=list(self.config.pool_globs),
            balance=self.spec.balance,
            balance_field=self.spec.balance_field,
            random_level=self.spec.random_level,
            epoch=self.epoch,
            epoch_overrides={**{d + "/": e for d, e in self.dir_epochs.items()}, **self.file_epochs},
            views=len(self._open_views) - len(self._idle),
            idle_views=len(self._idle),
            handles=len(self._handles),
            inodes=len(self._nodes),
            cache_dir=str(self.index_cache.dir),
            memory={**self.windows.describe(), **self.plan_memory.describe()},
            epoch_prefetches=self.epoch_prefetches,
            read_bytes=self.read_bytes.snapshot(),
            **({"staging": self.stages.describe()} if self.stages is not None else {}),
        )

    # ------------------------------------------------------------------ refused: read-only

    @_erofs
    async def setattr(self, inode, attr, fields, fh, ctx): ...

    @_erofs
    async def write(self, fh, off, buf): ...

    @_erofs
    async def create(self, parent_inode, name, mode, flags, ctx): ...

    @_erofs
    async def mknod(self, parent_inode, name, mode, rdev, ctx): ...

    @_erofs
    async def mkdir(self, parent_inode, name, mode, ctx): ...

    @_erofs
    async def unlink(self, parent_inode, name, ctx): ...

    @_erofs
    async def rmdir(self, parent_inode, name, ctx): ...

    @_erofs
    async def symlink(self, parent_inode, name, target, ctx): ...

    @_erofs
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx): ...

    @_erofs
    async def link(self, inode, new_parent_inode, new_name, ctx): ...
