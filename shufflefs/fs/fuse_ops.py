"""pyfuse3 operations: the kernel's requests mapped onto the mount's `serve.Catalog`.

This module only translates: inode and handle numbers to nodes and handles, catalog nodes to
attributes, `serve.Reply` to `FUSEError`, and any other exception to EIO (logged and counted;
pyfuse3 would otherwise stop the whole mount).  What a request does is the catalog's.

Caching.  A data file's inode never changes its bytes (a new epoch or source version is a new
inode).  A lookup gives a view's name to the kernel for `META_TIMEOUT`, like every other name, so a
``stat`` followed by an ``open`` (or the three path walks of ``ls -l``) costs one lookup.  What
makes that safe: an epoch change tells the kernel to drop every name it keeps before the
``setxattr`` is answered (`KernelNames`), and an open of a view checks its source's version first
(ESTALE if it changed: the kernel looks the name up again and retries once).  Without that
notification (kernels before 6.16) views keep ``entry_timeout=0``.  Listings are READDIRPLUS
(pyfuse3 always sends attributes with a name) and give views ``entry_timeout=0``: the kernel
stamps a listed name with its cache generation when it reads the reply, which may be after an
epoch change the reply predates, so a listed view is looked up once (answered from the listing,
`serve.tree.LISTING_TTL`).  ``security.*`` and ``system.*`` attributes are ENOTSUP without
entering the catalog: ``ls -l`` then stops asking for them on this mount.  Views are
served through the page cache with ``keep_cache`` (a view inode's bytes never change), so shared
``mmap`` works on every view; with ``--direct-io`` every view but ``.npy`` and fixed-size ones uses
``direct_io`` instead (reads arrive as the application issued them; shared mappings fail).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from typing import Any, Callable

import pyfuse3
import trio
from pyfuse3 import FUSEError

from ..config import MountConfig
from ..errors import DESCRIPTOR_ERRNOS, descriptors_note
from ..serve import xattrs
from ..serve.access import Caller
from ..serve.catalog import Catalog
from ..serve.nodes import LINK, ROOT, VIEW, Handle, Node, Probe, Reply, Stat, view_mtime_ns
from ..serve.workers import Timeout
from .kernel_names import KernelNames

log = logging.getLogger("shufflefs")

assert ROOT == pyfuse3.ROOT_INODE
META_TIMEOUT = 1.0
"""Seconds the kernel may cache attributes and non-view entries (the source tree rarely changes)."""
VIEW_BLKSIZE = 1 << 20
"""``st_blksize`` of views: stdio and Python size their reads by it; FUSE requests max out at 1 MiB."""
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC
UNSUPPORTED_XATTRS = (b"security.", b"system.")
"""Attribute namespaces the mount keeps nothing in: ENOTSUP, which ``ls -l`` (coreutils) takes as
"not on this filesystem" and stops asking (two requests per file otherwise).  ENOSYS would stop
the kernel from sending any getxattr, ours included."""
def _guard(fn: Callable) -> Callable:
    """`Reply` becomes its errno, a call past its deadline ETIMEDOUT, running out of descriptors
    EMFILE or ENFILE (logged: a limit, not a bug); unexpected exceptions become EIO, logged and
    counted."""

    @functools.wraps(fn)
    async def wrapper(self: "ShuffleFS", *args: Any) -> Any:
        try:
            return await fn(self, *args)
        except Reply as e:
            raise FUSEError(e.errno) from None
        except (FUSEError, trio.Cancelled):
            raise
        except Timeout as e:  # a call on a hung source: logged when its deadline passed
            self.catalog.stats.error(f"{fn.__name__}: {e}")
            raise FUSEError(errno.ETIMEDOUT) from None
        except Exception as e:  # noqa: BLE001 -- logged and counted, never swallowed silently
            if isinstance(e, OSError) and e.errno in DESCRIPTOR_ERRNOS:  # out of descriptors: not a bug
                self.catalog.stats.error(f"{fn.__name__}: {e}{descriptors_note(e)}")
                raise FUSEError(e.errno) from None
            log.exception("%s failed", fn.__name__)
            self.catalog.stats.error(f"{fn.__name__}: internal error: {e!r}")
            raise FUSEError(errno.EIO) from None

    return wrapper


def _erofs(fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def refuse(self: "ShuffleFS", *args: Any) -> Any:
        raise FUSEError(errno.EROFS)

    return refuse


def attributes(node: Node, st: Stat | None = None, listing: bool = False,
               view_entry: float = 0.0) -> pyfuse3.EntryAttributes:
    """``view_entry``: seconds the kernel may keep a view's name (0 in listings, see the module's
    docstring).  ``listing``: a view whose size is not known yet (a listing reads no file) gets its
    source's size with ``attr_timeout`` 0.  The kernel never shows it: a listed view's name is
    looked up again before any use, and a lookup sizes it."""
    st = st or node.st
    timeout = META_TIMEOUT
    a = pyfuse3.EntryAttributes()
    a.st_ino = node.ino
    a.generation = 0
    a.st_mode = st.st_mode
    a.st_nlink = st.st_nlink
    a.st_uid = st.st_uid
    a.st_gid = st.st_gid
    a.st_rdev = 0
    if node.kind == VIEW:
        size = node.size
        if size < 0:  # the kernel would take it for a broken inode (EIO, no log)
            if not listing:
                raise RuntimeError(f"{node.relpath}: attributes asked before its size was known")
            size, timeout = st.st_size, 0
        a.st_size = size
        a.st_blksize = VIEW_BLKSIZE
        a.st_blocks = (size + 511) // 512
        a.entry_timeout = 0 if listing else view_entry
    else:
        a.st_size = len(os.fsencode(node.target)) if node.kind == LINK and node.target else st.st_size
        # a store other than local files may leave these out (a stat_result of the first 10 fields)
        a.st_blksize = st.st_blksize or VIEW_BLKSIZE
        a.st_blocks = st.st_blocks if st.st_blocks is not None else (a.st_size + 511) // 512
        a.entry_timeout = META_TIMEOUT
    a.attr_timeout = timeout
    a.st_atime_ns = st.st_atime_ns
    a.st_mtime_ns = view_mtime_ns(st.st_mtime_ns, node.epoch) if node.kind == VIEW else st.st_mtime_ns
    a.st_ctime_ns = st.st_ctime_ns
    return a


def _invalidate(inodes: list[int]) -> None:
    for ino in inodes:
        try:
            pyfuse3.invalidate_inode(ino, attr_only=False)
        except OSError:  # forgotten by the kernel meanwhile (ENOENT), or not supported
            pass


class ShuffleFS(pyfuse3.Operations):
    """The operations of one mount.  Call `start` with a nursery before serving requests."""

    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, config: MountConfig) -> None:
        super().__init__()
        self.catalog = Catalog(config)
        self._handles: dict[int, Handle] = {}
        self._dirs: dict[int, tuple[Node, list[Probe]]] = {}
        self._next_fh = 1
        self.names = KernelNames()
        self.view_entry = 0.0  # seconds the kernel keeps a looked-up view's name (see `start`)
        self.paged: set[int] = set()  # view inodes opened through the page cache (`drop_past_pages`)
        self._nursery: trio.Nursery | None = None

    @property
    def index_cache(self) -> Any:
        return self.catalog.planner.index_cache

    def start(self, nursery: trio.Nursery) -> None:
        """Once mounted: views' names are cached by the kernel if it can be told to drop them."""
        self.catalog.start(nursery)
        self._nursery = nursery
        if self.names.attach():
            self.view_entry = META_TIMEOUT
            self.catalog.names_cached = True

    def mounted(self) -> None:
        """The kernel answered INIT (whether passthrough is on is known) and readers may come."""
        self.catalog.prep.at_mount()

    def _view_entry(self, node: Node) -> float:
        """A pool's shard follows every member's version (its size too): looked up at every use,
        as every view is without the kernel's name expiry; its open checks every member."""
        return 0.0 if node.pool is not None else self.view_entry

    def stopping(self) -> None:
        self.catalog.stopping()

    def shutdown(self) -> None:
        """Release every handle and close the catalog; called once the FUSE loop has ended."""
        for fh in list(self._handles):
            self.catalog.release(self._handles.pop(fh))
        self.catalog.shutdown()

    def _fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # ------------------------------------------------------------------ tree

    @_guard
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        node = await self.catalog.lookup(self.catalog.tree.node(parent_inode), os.fsdecode(name))
        return attributes(node, view_entry=self._view_entry(node))

    @_guard
    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            self.catalog.forget(ino, n)

    @_guard
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        node = self.catalog.tree.node(inode)
        if node.kind == VIEW:
            if node.size < 0:
                await self.catalog.size(node)
            return attributes(node, view_entry=self._view_entry(node))
        return attributes(node, await self.catalog.restat(node))

    @_guard
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return os.fsencode(await self.catalog.readlink(self.catalog.tree.node(inode)))

    @_guard
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        node = self.catalog.tree.node(inode)
        entries = await self.catalog.listing(node)
        fh = self._fh()
        self._dirs[fh] = (node, entries)
        return fh

    @_guard
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        parent, entries = self._dirs[fh]
        for i in range(start_id, len(entries)):
            probe = entries[i]
            node = await self.catalog.listed(parent, probe)
            if node is None:
                continue
            if not pyfuse3.readdir_reply(token, os.fsencode(probe.name), attributes(node, listing=True), i + 1):
                self.catalog.unlisted(node)
                return
            node.lookups += 1

    @_guard
    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    @_guard
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        sv = await self.catalog.statvfs()
        d = pyfuse3.StatvfsData()
        d.f_bsize, d.f_frsize = sv.f_bsize, sv.f_frsize
        d.f_blocks, d.f_bfree, d.f_bavail = sv.f_blocks, sv.f_bfree, sv.f_bavail
        d.f_files, d.f_ffree, d.f_favail = sv.f_files, sv.f_ffree, sv.f_favail
        d.f_namemax = sv.f_namemax
        return d

    # ------------------------------------------------------------------ files

    @_guard
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self.catalog.tree.node(inode)
        if flags & _WRITE_FLAGS:
            raise FUSEError(errno.EROFS)
        h = await self.catalog.open(node)
        early = None
        if node.kind == VIEW:
            pt = self.catalog.passthrough
            try:  # a Parquet view: read by the kernel from its stage, or from it as it is written
                early = await pt.early.open(self.catalog, node) if pt.wants(node) else None
                stage = None if early is not None else await pt.stage(self.catalog, node)
            except BaseException:
                self.catalog.release(h)
                raise
        fh = self._fh()
        self._handles[fh] = h
        h.fh = fh
        if node.kind != VIEW:
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=False)
        if early is not None:  # the daemon serves it (`serve.early_opens`), the kernel caches it
            self.catalog.passthrough.early.attach(fh, early)
            self.paged.add(node.ino)
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=True)
        if stage is not None:  # (the reply's flags are the stage's: `shufflefs._passthrough`)
            self.catalog.passthrough.attach(fh, stage, node)
            self.catalog.prep.ahead(node)  # the next epoch's stage, while this one is read
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=False)
        page_cache = self.catalog.page_cache(node)
        if page_cache:
            self.paged.add(node.ino)
        return pyfuse3.FileInfo(fh=fh, direct_io=not page_cache, keep_cache=page_cache)

    @_guard
    async def read(self, fh: int, off: int, size: int) -> Any:
        h = self._handles.get(fh)
        if h is None:
            raise FUSEError(errno.EBADF)
        early = self.catalog.passthrough.early.get(fh)
        if early is not None:  # its stage as it is written (`serve.early_opens`)
            return await self.catalog.passthrough.early.read(self.catalog, h, early, off, size)
        return await self.catalog.read(h, off, size)

    @_guard
    async def flush(self, fh: int) -> None:
        return None

    @_guard
    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    @_guard
    async def release(self, fh: int) -> None:
        h = self._handles.pop(fh, None)
        if h is not None:
            self.catalog.passthrough.detach(fh)
            self.catalog.release(h)
            if h.node.ino in self.paged and self._past(h.node) and self._nursery is not None:
                self.paged.discard(h.node.ino)
                self._nursery.start_soon(trio.to_thread.run_sync, _invalidate, [h.node.ino])

    # ------------------------------------------------------------------ extended attributes

    @_guard
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return xattrs.names(self.catalog.tree.node(inode), self.catalog)

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if name.startswith(UNSUPPORTED_XATTRS):  # asked of every file by ls -l: the cheapest answer
            raise FUSEError(errno.ENOTSUP)
        return await self._getxattr(inode, name, Caller.of(ctx))

    @_guard
    async def _getxattr(self, inode: int, name: bytes, caller: Caller) -> bytes:
        return await xattrs.get(self.catalog, self.catalog.tree.node(inode), name, caller)

    @_guard
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        """An epoch change is answered once the kernel has dropped every name it keeps, so that
        the next path walk looks the new epoch's inodes up."""
        await xattrs.set(self.catalog, self.catalog.tree.node(inode), name, value, Caller.of(ctx))
        moved = name in (xattrs.X_EPOCH, xattrs.X_RESUME)  # views' names now lead to other inodes
        if moved and self._nursery is not None:
            self._nursery.start_soon(self.drop_past_pages)
        if moved and self.view_entry and not self.names.expire():
            self.view_entry = 0.0
            self.catalog.names_cached = False
            await trio.sleep(META_TIMEOUT + 0.05)  # the names given out before expire by then

    def _past(self, node: Node) -> bool:
        """A view no handle holds whose epoch (or resume state) is no longer its file's."""
        return node.opens == 0 and not self.catalog.current(node)

    async def drop_past_pages(self) -> None:
        """Tell the kernel to drop the cached pages of views whose epoch has passed and that no
        handle (nor mapping) holds: it would keep them until memory runs short (an inode stays in
        its cache after its name expires), beside the new epoch's.  Dropped pages of a view that is
        opened again (its epoch set back) are read again, the same bytes."""
        past = []
        for ino in list(self.paged):
            node = self.catalog.tree.nodes.get(ino)
            if node is None:
                self.paged.discard(ino)
            elif self._past(node):
                self.paged.discard(ino)
                past.append(ino)
        if past:  # on a thread: the kernel locks each page, and a page may wait for a read of ours
            await trio.to_thread.run_sync(_invalidate, past)

    @_guard
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        xattrs.remove(self.catalog.tree.node(inode), name)

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
