"""The catalog of one mount: the source tree as nodes, each data file's views by epoch, their
plans, pools, parts, stages and windows.  Async (trio) but free of FUSE: `shufflefs.fs.fuse_ops` maps
kernel requests onto it, and tests can drive it without a mount.

All methods run in the trio thread; anything that touches the source or gathers records runs on
worker threads (`workers.Workers`).  The daemon never touches paths inside its own mount.
Methods end a request with `nodes.Reply` (an errno); errors a reader must be able to trace are
logged and counted first (`fail`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Any

import trio

from .. import replies
from ..config import MIX_DIR, PARTS_DIR, MountConfig
from ..errors import UNDECIDED_ERRNOS, FormatError, ResumeMismatch, ShuffleError, StaleSourceError, descriptors_note
from ..index.table import SourceStamp
from ..pools.lookup import PoolTable
from ..pools.mixes import MixTable
from ..shared_tasks import SharedTasks
from ..sources import Store, open_store
from ..strategies.resume import ResumeState
from ..windows.cache import WindowCache
from .epoch_prep import EpochPrep
from .epochs import Epochs
from .mix_tree import MixTree, in_mix_tree
from .passthrough import Passthrough
from .nodes import DIR, FILE, LINK, NO_POOL, ROOT, UNREAD, VIEW, Handle, Node, Probe, Reply, Stat, shard_stat
from .planner import RESUME_MISFIT, Planner
from .reads import Reads
from .serving import page_cache
from .stats import Stats
from .tree import Tree
from .versions import MemberVersions
from .views import Views
from .workers import META_DEADLINE, Timeout, Workers

log = logging.getLogger("shufflefs")

class Catalog:
    """Call `start` with a nursery before serving requests."""

    def __init__(self, config: MountConfig, store: Store | None = None) -> None:
        """``store``: the source tree (default: the store of ``config.source``'s scheme)."""
        self.config = config
        self.spec = config.spec
        self.store = store if store is not None else open_store(os.fspath(config.source), config.store_options)
        self.source = self.store.root
        self.mountpoint = os.path.abspath(os.fspath(config.mountpoint))
        self.stats = Stats()
        self.epochs = Epochs(int(config.epoch))
        self.workers = Workers(max(META_DEADLINE, getattr(self.store, "call_deadline", 0.0)))
        self.tasks = SharedTasks()
        self.windows = WindowCache(trio.CapacityLimiter(max(2, min(4, os.cpu_count() or 2))))
        self.tree = Tree(self.store, config)
        self.planner = Planner(config, self.store, self.workers, self.tasks,
                               lambda: self.views.drop_a_plan(), lambda: self.windows.landed)
        self.views = Views(config, self.store, self.tree, self.planner, self.workers, self.tasks,
                           self.windows, self.epochs.of, self.current)
        self.reads = Reads(self.views, self.windows, config.compiled_replies, config.reply_threads)
        self.passthrough = Passthrough(config.passthrough, replies.compiled if replies.bound else None,
                                       self.planner.decoding.disk, config.stage_wait, str(self.source))
        self.pools = PoolTable(self.store, self.tree.pool_key, config.pool_globs) if config.pool else None
        self.tree.pools = self.pools
        self.mixes = None
        if config.mixes:  # a mixture that cannot be served as declared refuses the mount, with the reason
            table = MixTable(self.store, self.tree.format_key, config.mixes)
            problems = table.check()
            if problems:
                self.store.close()
                raise ValueError("; ".join(problems))
            self.mixes = MixTree(table, self.tree)
        self.versions = MemberVersions(self.store, self.workers, self.pools, self.mixes.table if self.mixes else None)
        self.handles = 0
        self.prep = EpochPrep(self)
        # True: the kernel keeps views' names (`fs.KernelNames`), so an open may come without a lookup
        self.names_cached = False
        self.serving: dict[str, int] = {}  # views opened, by how they are served and why

    def start(self, nursery: trio.Nursery) -> None:
        """Background window loads and stage builds run in ``nursery`` (cancelled at unmount)."""
        self.windows.nursery = nursery
        if self.views.stages is not None:
            self.views.stages.nursery = nursery

    def stopping(self) -> None:
        """The mount is stopping (a signal, or the FUSE loop ended): background stage builds and
        Parquet copies being filled stop at their next chunk."""
        if self.views.stages is not None:
            self.views.stages.stop.set()
        self.views.parquet.copies.stop.set()

    def shutdown(self) -> None:
        """Close every source file and remove the stages; called once the FUSE loop has ended
        (and every handle was released)."""
        for node in list(self.tree.nodes.values()) + list(self.views.idle.values()):
            self.views.close(node)
        self.windows.clear()
        for copies in (self.views.stages, self.planner.decoding, self.passthrough, self.views.parquet):
            if copies is not None:
                copies.close()
        self.store.close()
        self.reads.replies.close()  # every handle was released: no reply is in flight

    def fail(self, what: str, relpath: str, epoch: int, offset: int | None, e: BaseException) -> Reply:
        """Log and count an error a reader will see, and turn it into the errno it gets."""
        where = f" at view offset {offset}" if offset is not None else ""
        reply = self._errno(what, relpath, e)
        if isinstance(e, StaleSourceError) and self.mixes is not None:
            self.mixes.table.stale()  # the next lookup of a mixture's shard reads its files' versions
        self.stats.error(f"{what} {relpath} (epoch {epoch}){where}: {e}{descriptors_note(e)}", relpath, reply.errno)
        return reply

    def _errno(self, what: str, relpath: str, e: BaseException) -> Reply:
        if isinstance(e, ShuffleError):
            return Reply(e.errno)
        if isinstance(e, FileNotFoundError):
            return Reply(errno.ESTALE)
        if isinstance(e, OSError) and e.errno in (errno.ELOOP, errno.EXDEV):
            gone = self.gone(relpath, e)  # a view opened before: its file left the path, as if renamed
            return Reply(errno.ESTALE) if what == "read" else gone
        if isinstance(e, OSError) and e.errno:
            return Reply(e.errno)
        return Reply(errno.EIO)

    # ------------------------------------------------------------------ the tree

    async def entry(self, relpath: str, probe: Probe, space: tuple[int, int] = (0, 1), sized: bool = True,
                    epoch: int | None = None) -> Node:
        """The node for a probed entry (existing or new) in the tree of loader part ``space``
        (``(part, parts)``; ``(0, 1)`` is the mount's own tree); does not count a lookup.
        ``sized=False`` (a listing) may leave a view's size unknown (-1): a text file's last byte
        unread, a rank's share or a shard not planned, so that listing reads and indexes nothing.
        ``epoch``: another epoch's view than the current one's (`EpochPrep.ahead`)."""
        st = probe.st
        suffix = () if space == (0, 1) else space
        pool = None
        if stat.S_ISDIR(st.st_mode):
            key: tuple = ("d", relpath, *suffix)
            kind = DIR
        elif stat.S_ISLNK(st.st_mode):
            key, kind = ("l", relpath, *suffix), LINK
        elif probe.fmt is None:
            key, kind = ("f", relpath, *suffix), FILE
        else:
            pool = probe.pool
            if pool is NO_POOL:
                pool = None if self.pools is None else await self.workers.run(self.pools.find, relpath, SourceStamp.of(st))
            stamp = SourceStamp.of(st)  # one object for the key and the node (a node per listed file)
            if pool is not None and pool.access is not None:  # readable only by who may read every member
                st = shard_stat(st, pool.access)
            version = pool.stamps if pool is not None else stamp
            epoch_path = pool.epoch_path if pool is not None else relpath
            epoch = self.epochs.of(epoch_path) if epoch is None else epoch
            problem = None  # a resumed view is a node of its own (and a shard follows its pool's layouts)
            if pool is None:
                resumed, stops = self.epochs.resumed(relpath, epoch_path)
            else:
                resumed, stops, problem = self.epochs.resumed_shard(relpath, pool.shard_paths, epoch_path)
            # an index found wrong since makes a new node: a shard's or share's size follows it
            found_wrong = self.planner.generation(("pool", pool.pool.key) if pool is not None else ("file", relpath))
            key, kind = ("v", relpath, epoch, version, found_wrong, resumed, *suffix), VIEW
        node = self.tree.find(key)
        if node is None:
            node = self.tree.add(kind, relpath, key, st)
            node.target = probe.target
            node.part, node.parts = space
            if kind == VIEW:
                node.fmt = probe.fmt
                node.epoch = key[2]
                node.resume, node.resume_problem = stops, problem
                node.stamp = stamp
                node.pool = pool
                node.size = -1
        elif kind != VIEW or pool is not None:  # a shard: its members' (or their directories') modes now
            node.st = st
            node.target = probe.target
        if kind == VIEW and sized and node.size < 0:
            try:
                await self._size(node, probe)
            except BaseException:
                if node.lookups <= 0 and node.opens == 0:
                    self.views.drop(node)
                raise
        return node

    async def _size(self, node: Node, probe: Probe) -> None:
        """Set a view's size: a rank's share, a shard, a resumed view or a compressed file's view
        from its plan, else from the file's size and (text) its last byte."""
        if self.config.world > 1 or node.parts > 1 or node.pool is not None or node.resume or node.fmt.planned_size:
            try:
                await self.planner.plan(node)  # sizes it
            except ResumeMismatch as e:  # the name stands (size 0), so that its user.shufflefs.error is
                self.fail("lookup", node.relpath, node.epoch, None, e)  # readable; every open is EINVAL
                node.resume_problem = e.message.removeprefix(RESUME_MISFIT)
                node.size = 0
            except FormatError as e:  # a compressed file that does not decode: the same, and opens get EIO
                if not node.fmt.planned_size:
                    raise
                self.fail("lookup", node.relpath, node.epoch, None, e)
                node.broken, node.size = e, 0
            return
        if probe.last_byte == UNREAD:
            await self.workers.run(self.tree.read_last_byte, node.relpath, probe)
        if node.size < 0:
            node.size = node.fmt.view_size(probe.st.st_size, probe.last_byte)

    async def lookup(self, parent: Node, name: str) -> Node:
        """The child ``name`` of a directory, counted as one more lookup.  A name whose listing
        attributes are younger than `tree.LISTING_TTL` is answered from them without a stat (the
        kernel looks a view up again for every path it resolves: ``ls -l`` makes three lookups
        per name); an open of its view then checks the version."""
        if parent.kind != DIR:
            raise Reply(errno.ENOTDIR)
        if name == ".":
            node = parent
        elif name == "..":
            node = self.tree.find(self.tree.up_key(parent))
            if node is None:
                raise Reply(errno.ENOENT)
        elif self._mixing(parent, name):
            relpath = os.path.join(parent.relpath, name) if parent.relpath else name
            try:
                probe = await self.workers.run(self.mixes.look, parent.relpath, name)
                if probe is None:
                    raise Reply(errno.ENOENT)
                node = await self.entry(relpath, probe, parent.space)
            except (ShuffleError, OSError) as e:
                raise self.fail("lookup", relpath, self.epochs.of(relpath), None, e) from None
        elif parent.role is not None or (parent.ino == ROOT and name == PARTS_DIR):
            node = self.tree.split_dir(parent, name)
        else:
            relpath = os.path.join(parent.relpath, name) if parent.relpath else name
            probe, trusted = self.tree.recent(parent.relpath, name), False
            if probe is not None and self.windows.nursery is not None:
                ahead = self.tree.ahead(parent.relpath, name)
                if ahead is not None:
                    self.windows.nursery.start_soon(self._refresh, parent.relpath, *ahead)
            if probe is None:
                try:
                    probe, trusted = await self.workers.run(self.tree.look, parent.relpath, name)
                except OSError as e:  # out of descriptors, ...: its errno, never an internal error
                    raise self.fail("lookup", relpath, self.epochs.of(relpath), None, e) from None
                if probe is None:
                    raise Reply(errno.ENOENT)
            try:
                node = await self.entry(relpath, probe, parent.space)
            except (ShuffleError, OSError) as e:
                raise self.fail("lookup", relpath, self.epochs.of(relpath), None, e) from None
            node.trusted = trusted
        node.lookups += 1
        return node

    def _mixing(self, parent: Node, name: str) -> bool:
        """Whether ``name`` in ``parent`` is in a ``.mix`` tree (the mount's or a part's)."""
        if self.mixes is None or parent.role is not None:
            return False
        return in_mix_tree(parent.relpath) or (parent.relpath == "" and name == MIX_DIR)

    async def probe(self, relpath: str) -> Probe | None:
        """An entry as it is now: a source file's, or a mixture's shard."""
        if self.mixes is not None and in_mix_tree(relpath):
            return await self.workers.run(self.mixes.probe, relpath)
        return await self.workers.run(self.tree.probe, relpath, os.path.basename(relpath))

    async def _refresh(self, relpath: str, listing: list, i: int) -> None:
        """Describe entries of a kept listing again ahead of the lookups (`Tree.ahead`)."""
        try:
            await self.workers.run(self.tree.refresh, relpath, listing, i)
        except Exception as e:  # noqa: BLE001 -- a background task must never end the mount
            log.debug("refreshing the listing of %s: %s", relpath, e)

    def forget(self, ino: int, n: int) -> None:
        node = self.tree.nodes.get(ino)
        if node is None or ino == ROOT:
            return
        node.lookups -= n
        if node.lookups <= 0 and ino not in self.views.idle:
            # an idle view keeps its node (and key) until it leaves the idle ones: the kernel
            # forgets an inode it looked up while revalidating a name, then looks it up again
            self.views.drop(node)

    async def restat(self, node: Node) -> Stat:
        """A non-view node's attributes as the source has them now."""
        if self.mixes is not None and in_mix_tree(node.relpath):
            return node.st  # a directory of the mount's own
        try:
            st = Stat(await self.workers.run(self.store.stat, node.relpath, node.ino == ROOT))
        except Timeout:
            if node.ino == ROOT and node.st is not None:  # the mount's own attributes and xattrs
                return node.st  # stay reachable while the source hangs (the timeout is logged)
            raise
        except (FileNotFoundError, NotADirectoryError):
            raise Reply(errno.ENOENT) from None
        except OSError as e:
            raise self.gone(node.relpath, e) from None
        node.st = st
        return st

    async def size(self, node: Node) -> None:
        """Size a listed view whose size is still unknown (its attributes were asked)."""
        probe = await self.probe(node.relpath)
        if probe is None or probe.fmt is None or SourceStamp.of(probe.st) != node.stamp:
            raise Reply(errno.ESTALE)  # no longer that version: the kernel looks the name up again
        await self._size(node, probe)

    def gone(self, relpath: str, e: OSError) -> Reply:
        """The errno of a failed path operation on the source.  A path that leads through a
        directory which became a symbolic link is gone as far as the mount is concerned: ENOENT,
        logged with the path (the link is never followed)."""
        if e.errno in (errno.ELOOP, errno.EXDEV):
            log.warning("%s: a directory on its path is a symbolic link now; not followed", self.store.path(relpath))
            return Reply(errno.ENOENT)
        return Reply(e.errno or errno.EIO)

    async def readlink(self, node: Node) -> str:
        if node.kind != LINK:
            raise Reply(errno.EINVAL)
        try:
            target = await self.workers.run(self.store.link_target, node.relpath)
        except FileNotFoundError:
            target = None
        except OSError as e:
            raise self.gone(node.relpath, e) from None
        if target is None:
            raise Reply(errno.ENOENT)
        return target

    async def listing(self, node: Node) -> list[Probe]:
        """A directory's entries (the split directories list nothing)."""
        if node.kind != DIR:
            raise Reply(errno.ENOTDIR)
        try:
            if self.mixes is not None and in_mix_tree(node.relpath):
                return await self.workers.run(self.mixes.list, node.relpath)
            return [] if node.role is not None else await self.workers.run(self.tree.list, node.relpath)
        except ShuffleError as e:
            raise self.fail("list", node.relpath, self.epochs.of(node.relpath), None, e) from None
        except OSError as e:
            raise self.gone(node.relpath, e) from None

    async def listed(self, parent: Node, probe: Probe) -> Node | None:
        """The node of a listed entry, or None to leave it out (a rank's share whose size is not
        known yet because its plan failed: the error is logged when it is opened)."""
        relpath = os.path.join(parent.relpath, probe.name) if parent.relpath else probe.name
        try:
            node = await self.entry(relpath, probe, parent.space, sized=False)
        except (ShuffleError, OSError):
            return None
        if node.lookups <= 0:
            node.trusted = False  # from a listing's attributes
        return node

    def unlisted(self, node: Node) -> None:
        """A listed entry the kernel did not take (its buffer was full): gone unless looked up."""
        if node.lookups == 0:
            self.views.drop(node)

    async def statvfs(self) -> os.statvfs_result:
        return await self.workers.run(self.store.statvfs)

    # ------------------------------------------------------------------ files

    async def open(self, node: Node) -> Handle:
        if node.kind == DIR:
            raise Reply(errno.EISDIR)
        if node.kind == LINK:
            raise Reply(errno.ELOOP)
        if node.kind == FILE:
            try:
                f = await self.workers.run(self.store.open_file, node.relpath)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ELOOP, errno.EXDEV):
                    raise self.gone(node.relpath, e) from None
                # a FIFO, socket or device under the name (ENXIO), a timeout: logged and counted
                raise self.fail("open", node.relpath, node.epoch, None, e) from None
            self.handles += 1
            return Handle(node, f)
        found_wrong = self.planner.generation(("pool", node.pool.pool.key) if node.pool else ("file", node.relpath))
        if node.key[4] != found_wrong:
            # its index was found wrong since its lookup: ESTALE, so the kernel looks the name up
            log.debug("open %s (epoch %d): its index was found wrong since its lookup: ESTALE", node.relpath, node.epoch)
            self.tree.forget_listed(node.relpath)  # again: a new inode, with none of the old one's pages
            raise Reply(errno.ESTALE)
        if node.pool is not None or not node.trusted or self.names_cached:
            await self._check_version(node)
        try:
            await self.views.open(node)
        except (ShuffleError, OSError) as e:
            raise self.fail("open", node.relpath, node.epoch, None, e) from None
        self.stats.files_opened += 1
        self.epochs.opened(node)
        self.handles += 1
        return Handle(node)

    async def _check_version(self, node: Node) -> None:
        """A view looked up from a listing's attributes, or whose name the kernel may have kept
        since its lookup, is opened only if its file is still that version; else ESTALE, upon
        which the kernel looks the name up again (now with a stat) and retries the open once: a
        new open shows the new version, as after a fresh lookup.  A shard of a pool or a mixture
        checks every file it draws from, at every open (`versions`)."""
        if node.pool is not None:
            try:
                same = await self.versions.unchanged(node.pool)
            except OSError as e:  # could not tell (`UNDECIDED_ERRNOS`): not ESTALE
                raise self.fail("open", node.relpath, node.epoch, None, e) from None
            if not same:
                log.debug("open %s (epoch %d): a file of its pool changed or is gone: ESTALE", node.relpath, node.epoch)
                self.tree.forget_listed(node.relpath)
                raise Reply(errno.ESTALE)
            return
        try:
            st = await self.workers.run(self.store.stat, node.relpath)
        except (OSError, ShuffleError) as e:
            if isinstance(e, OSError) and e.errno in UNDECIDED_ERRNOS:  # could not tell: not ESTALE
                raise self.fail("open", node.relpath, node.epoch, None, e) from None
            st = None
        if st is None or SourceStamp.of(st) != node.stamp:
            log.debug("open %s (epoch %d): its file changed or is gone: ESTALE", node.relpath, node.epoch)
            self.tree.forget_listed(node.relpath)
            raise Reply(errno.ESTALE)
        node.trusted = True

    def page_cache(self, node: Node) -> bool:
        """Whether the kernel may cache the bytes of an opened node (`serving.page_cache`)."""
        return page_cache(node, self.config, self.serving)

    async def read(self, h: Handle, off: int, size: int) -> Any:
        node = h.node
        if node.kind == FILE:
            try:
                data = await self.workers.run(h.source.read, off, size, limiter=self.windows.limiter)
            except OSError as e:
                raise self.fail("read", node.relpath, node.epoch, off, e) from None
            self.stats.served(len(data), node.relpath, h.opened)
            return data
        if node.broken is not None:
            raise Reply(node.broken.errno)
        stage = getattr(node.view.view, "stage", None) if node.view is not None else None
        if stage is not None:  # read by the kernel: only its readahead of the view's own pages comes here
            return await self.workers.run(stage.pread, size, off)
        replies = self.reads.replies
        try:
            replies.sync(h)
            data = await self.reads.read(h, off, size)
            node.view.view.source.verify_open()  # never serve bytes of a source that changed
        except (ShuffleError, OSError) as e:
            replies.withdraw(h)
            if isinstance(e, StaleSourceError):
                node.broken = e
                replies.withdraw_node(node)  # its other handles' reads are refused too
            raise self.fail("read", node.relpath, node.epoch, off, e) from None
        n = len(data)
        self.stats.served(n, node.relpath, h.opened)
        h.last_end = off + n
        self.reads.offer(h)
        return data

    def release(self, h: Handle) -> None:
        self.handles -= 1
        node = h.node
        if node.kind == FILE:
            h.source.close()
            return
        self.reads.leave(h)
        node.opens -= 1
        if node.opens == 0:
            self.views.retire(node)

    # ------------------------------------------------------------------ epochs

    def current(self, node: Node) -> bool:
        """Whether a view shows what its name shows now: its file's epoch, resumed or not."""
        if node.epoch != self.epochs.of(node.epoch_path):
            return False
        if node.pool is None:
            return node.key[5] == self.epochs.resumed(node.relpath, node.epoch_path)[0]
        return node.key[5] == self.epochs.resumed_shard(node.relpath, node.pool.shard_paths, node.epoch_path)[0]

    def set_epoch(self, node: Node, epoch: int) -> None:
        """Move the epoch of ``node`` (the root: every file), then prepare the new epoch's views
        of the files opened most recently, so that the first read after the change finds window
        0 ready or on its way."""
        self.epochs.set(node, epoch)
        self.prep.moved(node)

    def set_resume(self, node: Node, state: ResumeState) -> None:
        """Resume ``state``'s epoch on every file (``node``: the root), as `set_epoch` does."""
        if node.kind != DIR or node.relpath != "":
            raise Reply(errno.ENOTSUP)
        self.epochs.set_resume(state)
        self.prep.moved(node)
