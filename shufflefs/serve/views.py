"""Open views and their windows: made on first open, shared by every handle of an inode, kept
idle for a while after the last handle closes, closed when their epoch is over.

All handles of one inode share its plan, its open source and its windows (`windows.cache.WindowCache`,
keyed by inode and window; its docstring has the prefetch design and the memory limit:
`windows.cache.WINDOWS` windows of the largest view in memory, for all views together).  The shards
of a pool's stream share the stream's windows (keyed by the stream), loaded through whichever
shard view is open.  The last `IDLE_VIEWS` views whose handles all closed stay open with their
windows, so that a reader that reopens the file per record does not rebuild the plan and reload
windows every time.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from typing import Callable, Hashable, NamedTuple

import numpy as np

from ..config import MountConfig
from ..formats import gather_check
from ..formats.npy import Columns, c_order_header, columns_of
from ..shared_tasks import SharedTasks
from ..sources.base import Source, Store
from ..sources.cache_mode import SourceCache
from ..sources.pool import PoolSource
from ..stages.stage_file import Stage, StagedSource
from ..stages.store import EpochBytes, StageStore, StageTarget
from ..strategies import Plan
from ..strategies.exchange import Partitions
from ..strategies.partial_local import pls_exchange
from ..strategies.torn import WithTorn
from ..windows.cache import WindowCache
from ..windows.shared_view import SharedView, ViewClosed
from ..windows.view import View, window_work
from .nodes import Node, frame_file
from .parquet_views import ParquetServing, ahead_of, copy_of, is_parquet, span_of, work_of
from .planner import Planner
from .tree import Tree
from .workers import Workers

log = logging.getLogger("shufflefs")

IDLE_VIEWS = 4
"""Views kept open (with their plan and cached windows) after their last handle closed, so that
readers that open the file for every record do not rebuild the plan and reload windows."""
STAGE_TARGETS = 64
"""Staged files whose exchange (O(blocks) each) is kept for their next epochs' views."""


class WindowRef(NamedTuple):
    """A view's window as the window cache knows it (`Views.window`)."""

    key: Hashable
    nbytes: int
    shift: int
    loader: Callable
    work: int  # bytes the load works with besides the window


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


def shares_stream(node: Node) -> bool:
    """A pool's shard whose windows are its pool stream's, shared by the stream's shards; not a
    resumed shard, whose stretches of several streams are its own."""
    return node.pool is not None and not node.resume and not is_parquet(node.fmt)  # a Parquet shard: its own


class Views:
    """The open views of one mount (``node.view``), their idle list and their stages."""

    def __init__(self, config: MountConfig, store: Store, tree: Tree, planner: Planner, workers: Workers,
                 tasks: SharedTasks, windows: WindowCache, epoch_of: Callable[[str], int],
                 current: Callable[[Node], bool] | None = None) -> None:
        self.config, self.store, self.tree, self.planner = config, store, tree, planner
        self.workers, self.tasks, self.windows, self.epoch_of = workers, tasks, windows, epoch_of
        # whether a node shows its file's current epoch (and resume state); default: the epoch alone
        self.current = current or (lambda n: n.epoch == epoch_of(n.epoch_path))
        self.read_bytes = EpochBytes()
        self.source_cache = SourceCache(config.source_cache)  # drop a window's source pages? (stat shows it)
        self.stages = StageStore(config.stage_dir, self.read_bytes) if config.stage_dir is not None else None
        self.open_views: set[int] = set()
        self.idle: OrderedDict[int, Node] = OrderedDict()
        self._owners: dict[Hashable, list[SharedView]] = {}  # open views of each window owner (see owner)
        self._pool_sources: dict[tuple, PoolSource] = {}
        self._stage_targets: OrderedDict[Hashable, StageTarget] = OrderedDict()
        self.parquet = ParquetServing(config.stage_dir or planner.index_cache.dir)  # Parquet files' copies

    # ------------------------------------------------------------------ opening

    async def open(self, node: Node) -> None:
        """Make ``node.view`` usable for one more handle (counted in ``node.opens``)."""
        node.opens += 1
        try:
            if node.broken is not None:
                raise node.broken
            self.idle.pop(node.ino, None)
            if node.view is not None and node.opens == 1 and self.planner.distrusted(node.view.view.index):
                self.close(node)  # its index was found wrong: a new view over a rebuilt one
            if node.view is None:
                await self.tasks.run(("view", node.ino), functools.partial(self.make, node))
        except BaseException:
            node.opens -= 1
            if node.opens == 0:
                self.close(node)
            raise

    async def make(self, node: Node) -> None:
        """Build the view of a node that is being opened (``node.opens`` > 0); once per node (run
        it through ``tasks`` under ``("view", ino)``)."""
        if node.view is not None:
            return
        plan = await self.planner.plan(node)
        stage = None
        if self.stages is not None and (node.pool is None or node.pool.mix is None) and not is_parquet(node.fmt):
            # a mixture is not staged; a Parquet file is read from its decoded copy
            stage = await self.stages.acquire(await self._stage_target(node), node.epoch)
        view = await self.workers.run(self._new_view, node, plan, stage, limiter=self.workers.index)
        if node.opens == 0:  # every opener gave up meanwhile
            view.close()
            return
        node.view = SharedView(view)
        self.open_views.add(node.ino)
        self._reserve(node)
        log.debug("view %s epoch %d: %d records, %d windows, %d bytes", node.relpath, node.epoch,
                  node.index.n, plan.n_windows, node.layout.size)

    def _source(self, node: Node) -> Source:
        """Blocking: the node's file, or for a shard its pool's files, opened once for all the
        pool's shards (one more user)."""
        decoding = self.planner.decoding  # a compressed file's decoded bytes
        if node.pool is None:
            return decoding.open(node.relpath, node.index.stamp, node.fmt, node.index)
        entry = node.pool
        key = (entry.pool.key, entry.pool.members, entry.stamps)
        if entry.mix is not None:
            key += (id(node.index),)  # an epoch of a mixture: the pieces of its files differ by epoch
        src = self._pool_sources.get(key)
        try:
            src = src.share() if src is not None else None
        except OSError:
            src = None
        if src is None:
            for k in [k for k, v in self._pool_sources.items() if v.closed]:
                del self._pool_sources[k]
            src = self._pool_sources[key] = PoolSource(list(entry.pool.members), node.index, decoding.opener(node.fmt))
        return src

    def _new_view(self, node: Node, plan: Plan, stage: Stage | None) -> View:
        """Blocking: the node's view over its source, with its epoch's ``stage`` in front when
        staging (released when the view closes, or now if it cannot be made)."""
        frame, columns = node.frame, None
        if is_parquet(node.fmt):  # encoded from its decoded copy, never staged
            source = self._source(node)
            try:
                return self.parquet.view(self.store.path(node.relpath), node.index, plan, node.layout, source,
                                         self.read_bytes.meter(node.epoch), self.planner.distrust_for(node),
                                         copy_of(self.store, node))
            except BaseException:
                source.close()
                raise
        try:
            if node.fmt.name == "npy":
                frame, columns = self._npy_columns(node)
            source = self._source(node)
        except BaseException:
            if stage is not None:
                self.stages.release(stage)
            raise
        if stage is not None and columns is not None:  # a stage holds rows' bytes, not columns'
            self.stages.release(stage)
            stage = None
        if stage is not None:  # the view's source now releases the stage when it closes
            source = StagedSource(source, stage, functools.partial(self.stages.release, stage))
        try:
            return View(self.store.path(node.relpath), node.index, plan, source, frame,
                        meter=self.read_bytes.meter(node.epoch),
                        check=gather_check(node.fmt, self.config.verify), distrust=self.planner.distrust_for(node),
                        columns=columns, source_cache=self.source_cache)
        except BaseException:
            source.close()
            raise

    def _npy_columns(self, node: Node) -> tuple[tuple[bytes, bytes] | None, Columns | None]:
        """Blocking: an ``.npy`` view's frame and, if its file stores rows strided (Fortran
        order), their columns (`transposed`) with the whole view's header saying C order."""
        index = node.index
        own = (0 if node.pool.mix is not None else node.pool.shard) if node.pool is not None else None
        head = index.member_frames[own][1] if own is not None else index.header_end
        if not head:
            return node.frame, None
        src = self.store.open(*frame_file(node))
        try:
            header = src.read_range(0, head)
        finally:
            src.close()
        path = self.store.path(node.relpath)
        columns = columns_of(header, path)
        if columns is None or node.frame is not None:  # a share's header is rewritten already
            return node.frame, columns
        return (c_order_header(header, path), b""), columns

    async def _stage_target(self, node: Node) -> StageTarget:
        """What a view's stages hold: its file's (or pool's) version, partitioned for this rank."""
        index, epoch_path = node.index, node.epoch_path
        if node.pool is not None:
            e = node.pool
            file, name = ("pool", e.pool.key), e.pool.key
            key = ("pool", e.pool.key, e.pool.members, e.stamps, self.planner.generation(file))
            members = list(e.pool.members)
            opener = self.planner.decoding.opener(node.fmt)
            open_source: Callable[[], Source] = lambda: PoolSource(members, index, opener)
        else:
            file, name = ("file", node.relpath), node.relpath
            key = ("file", node.relpath, node.stamp, self.planner.generation(file))
            relpath, fmt = node.relpath, node.fmt
            open_source = lambda: self.planner.decoding.open(relpath, index.stamp, fmt, index)
        target = self._stage_targets.get(key)
        if target is None:
            exchange = await self.workers.run(pls_exchange, index.body(), self.config.spec, self.config.world,
                                              limiter=self.workers.index)  # as its plans: torn records apart
            partitions = WithTorn(Partitions(exchange, self.config.rank), index, self.config.rank, self.config.world)
            target = StageTarget(file, key, name, index, partitions, open_source,
                                 lambda: self.epoch_of(epoch_path))
            self._stage_targets[key] = target
            while len(self._stage_targets) > STAGE_TARGETS:
                self._stage_targets.popitem(last=False)
        self._stage_targets.move_to_end(key)
        return target

    def _reserve(self, node: Node) -> None:
        """Let the view's windows load; its largest window counts in the memory limit."""
        owner = self.owner(node)
        plan = node.plan.inner if shares_stream(node) else node.plan
        sizes = np.diff(node.layout.window_starts) if is_parquet(node.fmt) else np.asarray(plan.window_sizes)
        self._owners.setdefault(owner, []).append(node.view)
        self.windows.register(owner, int(sizes.max()) if len(sizes) else 0, work_of(node.fmt, node.view, plan),
                              getattr(self.store, "readahead", None), span_of(node.fmt, node.layout))

    # ------------------------------------------------------------------ windows

    @staticmethod
    def owner(node: Node) -> Hashable:
        """Whose windows a view reads: its own, or for a pool's shard its pool stream's, which all
        the shards of that stream share (a window is loaded once however the shards cut it)."""
        if not shares_stream(node):
            return node.ino
        e = node.pool  # the stream plan itself: one built over a rebuilt index has windows of its own
        return ("stream", e.pool.key, e.pool.members, e.stamps, node.epoch, node.part, node.parts, id(node.plan.inner))

    def window(self, node: Node, k: int, ahead: bool = False) -> WindowRef:
        """View window k as the window cache knows it; its bytes start ``shift`` bytes into the
        cached window (a shard's stretch of a stream window).  The loader builds it; ``ahead`` (a
        sequential reader): then hints the next window's blocks."""
        view = node.view
        if not shares_stream(node):
            return WindowRef((node.ino, k), node.layout.window_size(k), 0,
                             lambda out, scratch: view.load(k, out, scratch, ahead), work_of(node.fmt, view, node.plan, k))
        stream = node.plan.inner
        kin, shift = node.plan.stream_window(k)
        owner = self.owner(node)
        return WindowRef((owner, kin), int(stream.window_sizes[kin]), shift, functools.partial(
            _load_stream, self._owners[owner], kin, ahead, stream), window_work(stream, kin))

    def ahead(self, node: Node, k: int, n: int) -> list[WindowRef]:
        """The ``n`` windows a sequential reader of view window k reads next: the view's own, or
        for a pool's shard its stream's, which go on into the next shard (read next in name
        order), so that loads stay in flight across the end of a shard."""
        if not shares_stream(node):
            n = ahead_of(node.fmt, node.layout, k, n)
            return [self.window(node, j, ahead=True) for j in range(k + 1, min(k + 1 + n, node.layout.n_windows))]
        stream = node.plan.inner
        kin, _ = node.plan.stream_window(k)
        owner = self.owner(node)
        views = self._owners[owner]
        return [WindowRef((owner, j), int(stream.window_sizes[j]), 0,
                          functools.partial(_load_stream, views, j, True, stream), window_work(stream, j))
                for j in range(kin + 1, min(kin + 1 + n, len(stream.window_sizes)))]

    # ------------------------------------------------------------------ closing

    def retire(self, node: Node) -> None:
        """The last handle closed: keep the view idle (LRU) unless it can never be read again."""
        if (node.view is None or node.broken is not None or node.ino not in self.tree.nodes
                or self.planner.distrusted(node.view.view.index) or self._past_stage(node)):
            self.close(node)
            if node.lookups <= 0:
                self.drop(node)
            return
        drop = getattr(node.view.view, "drop_order", None)
        if drop is not None:  # a Parquet view waiting idle: its layout's order is only for its stage
            drop()
        self.idle[node.ino] = node  # its windows stay while memory allows
        self.idle.move_to_end(node.ino)
        while len(self.idle) > IDLE_VIEWS:
            _, oldest = self.idle.popitem(last=False)
            self.close(oldest)
            if oldest.lookups <= 0:  # prepared at an epoch change, never opened: forget it
                self.drop(oldest)

    def _past_stage(self, node: Node) -> bool:
        """A view read from a stage file (`serve.passthrough`) of an epoch before its file's
        current one: its name leads elsewhere now, and its file is the next stage's."""
        return (getattr(node.view.view, "stage", None) is not None
                and node.epoch < self.epoch_of(node.epoch_path))

    def drop(self, node: Node) -> None:
        """The node leaves the inode table (forgotten, or replaced); its view closes if unused."""
        self.tree.remove(node)
        if node.opens == 0:
            self.close(node)

    def close_stale(self) -> None:
        """Close the idle views of epochs that are no longer current: their names now lead to
        the new epoch's views, so they can never be opened again, and their plans and windows
        would otherwise share the memory with the new epoch's while it is being prepared."""
        for node in [n for n in self.idle.values() if not self.current(n)]:
            self.close(node)
            if node.lookups <= 0:
                self.drop(node)

    def close(self, node: Node) -> None:
        """Close the source and forget the plan (rebuilt cheaply; the index stays in the memo)."""
        self.idle.pop(node.ino, None)
        if node.view is not None:
            node.view.close()
            owner = self.owner(node)
            views = self._owners[owner]
            views.remove(node.view)
            node.view = None
            self.open_views.discard(node.ino)
            if not views:
                del self._owners[owner]
                self.windows.unregister(owner)
            if self.stages is not None:
                self.stages.tidy()
        self.planner.forget(node)

    def drop_a_plan(self) -> bool:
        """Close the view (and plan) least recently planned that no handle has open, to make room
        for another plan; False if there is none (see `plan_memory`)."""
        for ino in self.planner.memory.holders():
            node = self.tree.nodes.get(ino)
            if node is None:  # forgotten meanwhile
                self.planner.memory.release(ino)
                return True
            if node.plan is not None and node.opens == 0 and not self.tasks.running(("view", ino)):
                self.close(node)
                if node.lookups <= 0:
                    self.drop(node)
                return True
        return False
