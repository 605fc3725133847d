"""Indexes and plans of the catalog's views: built once however many opens ask at once, on
worker threads, remembered within memory budgets (`INDEX_MEMO_BOUNDS`, `plan_memory`)."""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import trio

from ..config import MountConfig
from ..errors import FormatError, ResumeMismatch, StaleSourceError
from ..formats import Format
from ..formats.npy import header_with_rows
from ..index.table import IndexCache, RecordIndex, SourceStamp, cache_key
from ..index.joined_index import PooledIndex, SegmentIndex
from ..pools.lookup import PoolEntry
from ..pools.mix_index import MixIndex, describe_epoch, epoch_index
from ..pools.mixes import MixError
from ..shared_tasks import SharedTasks, each
from ..sources.base import Store
from ..strategies import Plan, make_plan
from ..strategies.costs import record_costs
from ..strategies.resume import LengthOf, PlanOf, ResumeError, resumed_plan, share_length
from ..strategies.slices import SlicePlan, slice_edges
from ..stages.decoded import Decoding, served_size
from .nodes import Node, frame_file
from .parquet_views import Layout, joiner, layout_class, layout_of  # Layout, or a Parquet file's
from .plan_notes import PlanNotes, check_headers, check_npy_pool
from .plan_memory import MIX_BYTES_PER_RECORD, PlanMemory, physical_memory, plan_estimate, plan_nbytes
from .workers import Workers

log = logging.getLogger("shufflefs")

RESUME_MISFIT = "the resume state does not fit this view: "

COST_FILES = 4
"""Files whose ``--balance-field`` costs (4 bytes per record) are kept for the next epoch's plan."""
POOL_STREAMS = 4
"""Pools' streams (plans of the whole pool for an epoch and rank) kept for their shards' views."""
INDEX_MEMO_BOUNDS = 32 << 20
"""Record boundaries (8 bytes each) of recently used indexes kept in memory besides the disk cache."""
MIX_EPOCHS_SHOWN = 4
"""Epochs per mixture whose draws ``shufflefs stat`` shows."""
BAD_INDEXES = 256
"""Files whose index failed, remembered so that every open does not scan them again."""


class Planner:
    """``drop_a_plan`` closes an unused view to make room for a plan (False: none to close);
    ``landed`` counts window loads (a plan waiting for memory waits while they progress)."""

    def __init__(self, config: MountConfig, store: Store, workers: Workers, tasks: SharedTasks,
                 drop_a_plan: Callable[[], bool], landed: Callable[[], int]) -> None:
        self.config, self.spec, self.store, self.workers, self.tasks = config, config.spec, store, workers, tasks
        self.index_cache = IndexCache(config.cache_dir)
        self.decoding = Decoding(store, self.index_cache.dir, config.stage_dir or self.index_cache.dir,
                                 config.spec.strategy, config.decoded_copies)
        self.memory = PlanMemory()
        self._drop_a_plan, self._landed = drop_a_plan, landed
        self._indexes: OrderedDict[tuple, RecordIndex] = OrderedDict()
        self._bad_indexes: OrderedDict[tuple, FormatError] = OrderedDict()
        self._costs: OrderedDict[tuple, np.ndarray] = OrderedDict()  # --balance-field
        self._mix_costs: OrderedDict[tuple, np.ndarray] = OrderedDict()  # of mixtures' files (worker threads)
        self._pool_plans: OrderedDict[tuple, Plan] = OrderedDict()  # the pooled streams shards cut up
        self.notes = PlanNotes(config.spec)
        self.mixed: dict[str, dict[int, list[dict]]] = {}  # what mixtures' sources gave their epochs
        # indexes a window check found wrong (`distrust`, told from loading threads): forgotten
        # by the trio thread at its next use of the memos (`_drain`)
        self._lock = threading.Lock()
        self._distrusted: weakref.WeakSet[RecordIndex] = weakref.WeakSet()
        self._forget: set[tuple] = set()
        self._forget_versions: set[tuple] = set()
        self._generations: dict[tuple, int] = {}

    # ------------------------------------------------------------------ indexes

    async def index(self, node: Node) -> RecordIndex:
        """The node's file's index, or its pool's."""
        self._drain()
        if node.pool is not None and node.pool.mix is not None:
            return await self._mix_index(node)
        if node.pool is not None:  # its members' torn records moved last (made with the pool)
            return (await self._pool_index(node.pool, node.fmt)).torn_last()
        return await self.file_index(node.relpath, node.stamp, node.fmt)

    async def _mix_index(self, node: Node) -> MixIndex:
        """The epoch of a mixture (`pools.mix_index`) over the pool of all its files."""
        entry, mix = node.pool, node.pool.mix
        base = await self._pool_index(entry, node.fmt)
        key = (self._pool_key(entry, node.fmt), node.epoch)
        if key in self._indexes and self._indexes[key].base is base:
            self._indexes.move_to_end(key)
            return self._indexes[key]

        weights = [s.weight for s in mix.spec.sources]

        def build() -> MixIndex:
            where = f"mixture {mix.spec.name!r}"
            samples = base.n if mix.spec.samples is None else mix.spec.samples
            if samples * MIX_BYTES_PER_RECORD > physical_memory() // 2:
                raise MixError(mix.key, None, f"{where}: {samples:,} records per epoch need about "
                               f"{samples * MIX_BYTES_PER_RECORD / 1e9:,.0f} GB for their offset table, more than "
                               f"half of this machine's memory: lower its samples")
            try:
                index = epoch_index(base, mix.firsts, weights, mix.spec.samples, self.spec, node.epoch)
            except ValueError as e:
                raise MixError(mix.key, None, f"{where}: {e}") from None
            log.info("%s epoch %d: %s records from its sources", where, node.epoch, "+".join(map(str, index.takes)))
            return index

        async def memo() -> MixIndex:
            index = await self.workers.run(build, limiter=self.workers.index)
            self._memo(key, index)
            epochs = self.mixed.setdefault(mix.spec.name, {})
            epochs[node.epoch] = describe_epoch(index, mix.firsts, [s.glob for s in mix.spec.sources], weights,
                                                node.epoch)
            while len(epochs) > MIX_EPOCHS_SHOWN:
                del epochs[min(epochs)]
            return index

        return await self.tasks.run(("mix", *key), memo)

    def _memo(self, key: tuple, index: RecordIndex) -> None:
        self._indexes[key] = index
        while len(self._indexes) > 1 and sum(len(i.bounds) for i in self._indexes.values()) > INDEX_MEMO_BOUNDS:
            self._indexes.popitem(last=False)

    async def _pool_index(self, entry: PoolEntry, fmt: Format) -> PooledIndex:
        """The members' indexes (each built and cached like a single file's) joined in shard order."""
        pool = entry.pool
        key = self._pool_key(entry, fmt)
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]

        async def build() -> PooledIndex:
            members: list[RecordIndex | None] = [None] * len(pool.members)

            async def one(i: int) -> None:
                members[i] = await self.file_index(pool.members[i], entry.stamps[i], fmt)

            await each([lambda i=i: one(i) for i in range(len(pool.members))])  # a member's error as it is
            if fmt.name == "npy":
                await self.workers.run(check_npy_pool, self.store, pool)
            elif entry.mix is not None:
                await self.workers.run(check_headers, self.store, pool, members)
            names = [self.store.path(p) for p in pool.members]
            index = await self.workers.run(joiner(fmt), members, names, limiter=self.workers.index)
            log.info("pool %s: %d shards, %d records", pool.key, len(pool.members), index.n)
            self._memo(key, index)
            return index

        return await self.tasks.run(key, build)

    async def file_index(self, relpath: str, stamp: SourceStamp, fmt: Format) -> RecordIndex:
        """Built once per (file, stamp, format) even under concurrent opens; cached on disk."""
        self._drain()
        key = self._file_key(relpath, stamp, fmt)
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]
        if key in self._bad_indexes:
            raise self._bad_indexes[key]

        async def build() -> RecordIndex:
            t0 = time.monotonic()
            try:
                index = await self.workers.run(self._load_index, relpath, fmt, limiter=self.workers.index)
            except FormatError as e:
                self._bad_indexes[key] = e
                while len(self._bad_indexes) > BAD_INDEXES:
                    self._bad_indexes.popitem(last=False)
                raise
            log.info("index of %s: %d records (%s) in %.3f s", relpath, index.n, fmt, time.monotonic() - t0)
            if index.stamp != stamp:
                raise StaleSourceError(self.store.path(relpath), None, "source changed since it was looked up; reopen it")
            self._memo(key, index)
            return index

        return await self.tasks.run(("index",) + key, build)

    @staticmethod
    def _file_key(relpath: str, stamp: SourceStamp, fmt: Format) -> tuple:
        return (relpath, stamp, fmt.name, json.dumps(fmt.params(), sort_keys=True, default=str))

    @staticmethod
    def _pool_key(entry: PoolEntry, fmt: Format) -> tuple:
        return ("pool", entry.pool.key, entry.pool.members, entry.stamps, repr(fmt))

    def _load_index(self, relpath: str, fmt: Format) -> RecordIndex:
        """Blocking: the store's index (cached or scanned), checked against the file
        (`Format.check_index`); a cached one that fails is dropped and the file scanned again."""
        for attempt in range(2):
            index = self.decoding.index(relpath, fmt, self.index_cache.dir)  # a compressed scan writes its copy
            try:
                self._check_index(relpath, fmt, index)
                return index
            except FormatError as e:
                if attempt:
                    raise
                log.warning("index of %s dropped, rebuilding it: %s", relpath, e)
                key = cache_key(self.store.path(relpath), index.stamp, fmt.name, fmt.params())
                self.index_cache.drop(key)
                if hasattr(self.store, "distrust_published"):  # nor is a published copy taken again
                    self.store.distrust_published(key)
        raise AssertionError("unreachable")

    def _check_index(self, relpath: str, fmt: Format, index: RecordIndex) -> None:
        opened: list = []

        def read(start: int, end: int) -> bytes:
            if end <= start:
                return b""
            if not opened:
                opened.append(self.decoding.open(relpath, index.stamp, fmt, index, light=True))
            return opened[0].read_range(start, end)

        try:
            fmt.check_index(index, read, self.store.path(relpath))
        finally:
            if opened:
                opened[0].close()

    def distrust_for(self, node: Node) -> Callable[[RecordIndex], None]:
        """What a view of ``node`` calls (from a loading thread) when a window check finds its
        index wrong: the index is forgotten with its plans and costs (a pool's with its
        members'), and the cache entries of its files are deleted and their published indexes
        not taken again, so the next open rebuilds it from the files."""
        fmt = node.fmt
        if node.pool is None:
            files = [(node.relpath, node.stamp)]
            keys = [self._file_key(node.relpath, node.stamp, fmt)]
            version: tuple = (node.relpath, node.stamp)
            file: tuple = ("file", node.relpath)
        else:
            e = node.pool
            files = list(zip(e.pool.members, e.stamps))
            keys = [self._file_key(m, st, fmt) for m, st in files] + [self._pool_key(e, fmt)]
            version, file = (e.pool.key, e.pool.members, e.stamps), ("pool", e.pool.key)
        paths = [self.store.path(relpath) for relpath, _ in files]

        def distrust(index: RecordIndex) -> None:
            with self._lock:
                self._distrusted.add(index)
                self._forget.update(keys)
                self._forget_versions.add(version)
                self._generations[file] = self._generations.get(file, 0) + 1
            for path, (_, stamp) in zip(paths, files):
                key = cache_key(path, stamp, fmt.name, fmt.params())
                try:
                    self.index_cache.drop(key)
                except OSError as err:
                    log.warning("cannot remove the index cache entry of %s: %s", path, err)
                if hasattr(self.store, "distrust_published"):  # a published copy of it is not taken again
                    self.store.distrust_published(key)
            log.warning("index of %s found wrong while reading: dropped; the next open rebuilds it", paths[0]
                        if len(paths) == 1 else f"the pool of {len(paths)} files {paths[0]} ...")

        return distrust

    def distrusted(self, index: RecordIndex | None) -> bool:
        """Whether a window check found ``index`` wrong (its views must not be used again)."""
        return index is not None and index in self._distrusted

    def generation(self, file: tuple) -> int:
        """How many times the index of ``file`` (``("file", relpath)`` or ``("pool", key)``) was
        found wrong: part of what its stages are keyed by."""
        return self._generations.get(file, 0)

    def _drain(self) -> None:
        """Forget what `distrust` was told (the trio thread owns the memos)."""
        if not self._forget and not self._forget_versions:
            return
        with self._lock:
            keys, versions = self._forget, self._forget_versions
            self._forget, self._forget_versions = set(), set()
        for key in keys:
            self._indexes.pop(key, None)
        for key in [k for k in self._indexes if len(k) == 2 and k[0] in keys]:  # mixtures' epochs
            del self._indexes[key]
        for key in [k for k in self._pool_plans if k[:3] in versions]:
            del self._pool_plans[key]
        for version in versions:
            self._costs.pop(version, None)

    # ------------------------------------------------------------------ plans

    async def plan(self, node: Node) -> Plan:
        """The node's plan and layout (``node.plan``, ``node.layout``, ``node.index``), sizing a
        rank's share or a shard; counted in the plan memory until `forget`."""
        if node.plan is not None and self.distrusted(node.index):
            self.forget(node)  # planned over an index found wrong since (never opened since)
        if node.plan is not None:
            return node.plan

        async def build() -> Plan:
            if node.plan is not None:
                return node.plan
            index = await self.index(node)
            file = ("pool", node.pool.pool.key) if node.pool is not None else ("file", node.relpath)
            need = 0 if node.pool is not None else plan_estimate(self.spec.strategy, self.spec.balance, index.n)
            await self.memory.admit(node.ino, file, index.n, need, self._drop_a_plan, self._landed)
            try:
                plan, layout = await self._plan_and_layout(node, index)
            except BaseException:
                self.memory.release(node.ino)
                raise
            self.notes.note(node.pool.pool.key if node.pool is not None else node.relpath, index, node.parts)
            size = served_size(node.fmt, layout.size)  # a compressed view: its container's
            if node.size < 0:  # a rank's share or a shard: sized by its plan (a negative size
                node.size = size  # reaching the kernel would make the inode bad: EIO)
            elif size != node.size:
                self.memory.release(node.ino)
                raise FormatError(
                    self.store.path(node.relpath), None,
                    f"view has {size} bytes but {node.size} were announced; refusing to serve it",
                )
            node.index, node.layout = index, layout
            node.plan = plan
            self.memory.charge(node.ino, file, index.n, plan_nbytes(plan))
            return plan

        return await self.tasks.run(("plan", node.ino), build)

    def forget(self, node: Node) -> None:
        """The node's plan is no longer needed (rebuilt cheaply; the index stays in the memo)."""
        node.plan = node.layout = node.index = node.frame = None
        self.memory.release(node.ino)

    async def _plan_and_layout(self, node: Node, index: RecordIndex) -> tuple[Plan, Layout]:
        if node.pool is not None:
            return await self._shard_plan(node, index)
        if index.stamp != node.stamp:
            raise StaleSourceError(self.store.path(node.relpath), None, "source changed since it was looked up; reopen it")
        plan = await self._make_plan(node, index, (node.relpath, index.stamp))
        if node.fmt.name == "npy":  # a share of the rows needs a header that says so
            rows = int(np.asarray(plan.window_records).sum())
            if rows != index.n and index.header_end:
                frame = (index.size, index.header_end, index.trailer_start)
                node.frame = await self.workers.run(self._frame, node, frame, rows)
        head, trail = (None, None) if node.frame is None else map(len, node.frame)
        return plan, await self.workers.run(layout_class(node.fmt), index, plan, head, trail, limiter=self.workers.index)

    async def _make_plan(self, node: Node, index: RecordIndex, cost_key: tuple) -> Plan:
        """`make_plan` on a worker thread, with the records' costs for ``--balance`` (kept per
        file or pool version under ``cost_key``)."""
        known = self._costs.get(cost_key)

        def plan() -> tuple[Plan, np.ndarray | None]:
            costs = known
            if costs is None and self.spec.balance:
                costs = self._record_costs(node, index)

            def plan_of(rank: int, world: int, part: int, parts: int) -> Plan:
                return make_plan(index, self.spec, node.epoch, rank, world, part, parts, costs=costs)

            return self._resumed(node, plan_of, self._lengths(index.n, torn=index.torn)), costs

        made, costs = await self.workers.run(plan, limiter=self.workers.plan)
        if costs is not None:
            self._costs[cost_key] = costs
            self._costs.move_to_end(cost_key)
            while len(self._costs) > COST_FILES:
                self._costs.popitem(last=False)
        return made

    def _lengths(self, records: int, shards: int = 0, shard: int = 0, torn: int = 0) -> LengthOf | None:
        """How long the first layout's streams (or a shard of them) are without planning them,
        where shares are cut at equal counts (`share_length`): not with --balance or --even."""
        spec = self.spec
        if spec.balance:
            return None

        def length(r: int, w: int, i: int, k: int) -> int | None:
            if spec.even != "none" and w > 1:
                return None
            n = share_length(records, r, w, i, k, torn)
            if not shards:
                return n
            edges = slice_edges(n, shards)
            return int(edges[shard + 1] - edges[shard])
        return length

    def _resumed(self, node: Node, plan_of: PlanOf, length_of: LengthOf | None = None) -> Plan:
        """Blocking: the node's plan from ``plan_of`` (its stream of any layout), resumed after the
        layouts its epoch ran under (`strategies.resume`); a state that does not fit the view (a
        count past a stream's end) is the reader's EINVAL, logged with the view's path."""
        if node.resume_problem:
            raise ResumeMismatch(self.store.path(node.relpath), None, RESUME_MISFIT + node.resume_problem)
        try:
            return resumed_plan(plan_of, node.resume, self.config.rank, self.config.world, node.part, node.parts,
                                length_of)
        except ResumeError as e:
            raise ResumeMismatch(self.store.path(node.relpath), None, RESUME_MISFIT + str(e)) from None

    def _record_costs(self, node: Node, index: RecordIndex) -> np.ndarray | None:
        """Blocking: every record's cost (a pool's: its members' in shard order)."""
        field, fmt = self.spec.balance_field, node.fmt.name
        if node.pool is None:
            return self._costs_of(node.relpath, node.stamp, index, field, fmt)
        if field is None:
            return None  # byte lengths: the plan reads them from the index (a pool's, a mixture's)
        e = node.pool
        if not isinstance(index, SegmentIndex):  # a pool's records in their files' order
            return np.concatenate([self._costs_of(m, e.stamps[i], index.member_index(i), field, fmt)
                                   for i, m in enumerate(e.pool.members)])
        # a mixture's epoch or a pool with torn records last: its files' costs, read once per
        # version, then taken in the index's order
        version = (e.pool.key, e.pool.members, e.stamps)
        with self._lock:
            costs = self._mix_costs.get(version)
        if costs is None:
            costs = np.concatenate([self._costs_of(m, e.stamps[i], index.base.member_index(i), field, fmt)
                                    for i, m in enumerate(e.pool.members)])
            with self._lock:
                self._mix_costs[version] = costs
                while len(self._mix_costs) > COST_FILES:
                    self._mix_costs.popitem(last=False)
        return costs[index.base_ids()]

    def _costs_of(self, relpath: str, stamp: SourceStamp, index: RecordIndex, field: str | None, fmt: str) -> np.ndarray:
        load = lambda: self.store.map(relpath, stamp)  # noqa: E731 -- mapped only when needed
        return record_costs(self.store.path(relpath), index, field, fmt, load)

    async def _shard_plan(self, node: Node, index: PooledIndex) -> tuple[Plan, Layout]:
        """Shard i of a pool: the i-th stretch of the pool's stream (the rank's, or its part's),
        framed by the shard's own header and trailer.  A resumed shard: stretches of the shard's
        views of the layouts its epoch ran under (`strategies.resume`), its own windows."""
        entry = node.pool
        version = (entry.pool.key, entry.pool.members, entry.stamps)
        costs_key = version if entry.mix is None else (*version, node.epoch)  # a mixture's records vary by epoch
        shards = entry.shards

        def shard_of(stream: Plan) -> SlicePlan:
            edges = slice_edges(int(np.asarray(stream.window_records).sum()), shards)
            return SlicePlan(stream, int(edges[entry.shard]), int(edges[entry.shard + 1]), entry.shard, shards)

        if node.resume:
            known = self._costs.get(costs_key)

            def resumed() -> Plan:
                costs = known if known is not None or not self.spec.balance else self._record_costs(node, index)
                return self._resumed(node, lambda r, w, i, k: shard_of(make_plan(
                    index, self.spec, node.epoch, r, w, i, k, costs=costs)),
                    self._lengths(index.n, shards, entry.shard, index.torn))

            plan = await self.workers.run(resumed, limiter=self.workers.plan)
        else:  # the shard's stretch and layout (O(its rows)) on worker threads, off the event loop
            plan = await self.workers.run(shard_of, await self._stream(node, index, version, costs_key), limiter=self.workers.plan)
        own = 0 if entry.mix is not None else entry.shard  # a mixture's shards are framed as its first file
        node.frame = frame = await self.workers.run(self._frame, node, index.member_frames[own],
                                                    int(np.asarray(plan.window_records).sum()), limiter=self.workers.index)
        return plan, await self.workers.run(layout_of, node.fmt, index, plan, len(frame[0]), len(frame[1]),
                                            limiter=self.workers.index)

    async def _stream(self, node: Node, index: PooledIndex, version: tuple, costs_key: tuple) -> Plan:
        """The pool's stream that a shard cuts (the rank's, or its part's), built once for all
        the shards that ask at once and kept for the others (`POOL_STREAMS`)."""
        key = (*version, node.epoch, node.part, node.parts)
        self._drain()
        stream = self._pool_plans.get(key)
        if stream is not None and stream.index is not index:
            stream = None  # planned over an index since found wrong
        if stream is None:
            async def build() -> Plan:
                plan = await self._make_plan(node, index, costs_key)
                self._pool_plans[key] = plan
                while len(self._pool_plans) > POOL_STREAMS:
                    self._pool_plans.popitem(last=False)
                return plan

            return await self.tasks.run(("stream", *key), build)
        self._pool_plans.move_to_end(key)
        return stream

    def _frame(self, node: Node, frame: tuple[int, int, int], rows: int) -> tuple[bytes, bytes]:
        """Blocking: the header and trailer a share or a shard shows (``frame``: its file's size,
        header end and trailer start), its own file's, an ``.npy`` header rewritten for the rows
        it shows (``numpy.load`` refuses a count that is wrong)."""
        size, head, trail = frame
        src = self.decoding.open(*frame_file(node), node.fmt, light=True)
        try:
            header, trailer = src.read_range(0, head), src.read_range(trail, size)
        finally:
            src.close()
        if node.fmt.name == "npy" and head:
            header = header_with_rows(header, rows, self.store.path(node.relpath))
        return header, trailer

    def describe(self) -> dict[str, Any]:
        return self.memory.describe()

