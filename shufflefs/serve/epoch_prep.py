"""What an epoch change sets off: the views of the old epoch close, and the new epoch's views of
the files opened most recently are prepared (planned, window 0 loaded) before their first read."""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable

import trio

from ..errors import ShuffleError
from .nodes import VIEW, Node, Reply

log = logging.getLogger("shufflefs")


class EpochPrep:
    """Of one `catalog.Catalog` (not imported: it holds this)."""

    DEPTH = 2
    """Stages built ahead of the one opened.  Shards of 270 MiB read in turn: a stage takes
    0.13-0.15 s on the thread beside the reader, a shard's read 0.10-0.14 s, so the builds fall
    behind one shard ahead."""

    def __init__(self, cat: Any) -> None:
        self.cat = cat
        self.prefetches = 0  # window loads started by preparations
        self.staged_ahead = 0  # stages of a next epoch built before it was set (`ahead`)
        self._preparing: set[tuple] = set()  # files whose next epoch's view is being prepared
        self._ahead: dict[tuple, tuple[int, str]] = {}  # stages to build ahead: file -> (epoch, made)
        self._building: tuple[tuple, int] | None = None  # the one being built (file, epoch)

    def moved(self, node: Node) -> None:
        """The epoch setting on ``node`` moved: close the views that are no longer current, then
        prepare the new epoch's views of the files opened most recently."""
        self.cat.views.close_stale()
        if self.cat.views.stages is not None:
            self.cat.views.stages.tidy()
        files = self.cat.epochs.moved(node)  # newest first
        for relpath, space in files:
            if self.cat.windows.nursery is not None:
                self.cat.windows.nursery.start_soon(self._prepare, relpath, space, len(files) == 1)

    async def _prepare(self, relpath: str, space: tuple[int, int] = (0, 1), alone: bool = True,
                       made: str = "when its epoch was set") -> None:
        """Prepare the current epoch's view of ``relpath`` (`_once`), one at a time per
        file: epoch changes faster than plans are built start no more work, the running
        preparation repeats once for the epoch that is current when it ends.  (Without this a
        storm of epoch changes queued a plan per epoch, each held until its view was made.)"""
        key = (relpath, *space)
        if key in self._preparing:
            return
        self._preparing.add(key)
        try:
            while True:
                epoch = self.cat.epochs.of(relpath), self.cat.epochs.resume_gen
                await self._once(relpath, space, alone, made)
                if (self.cat.epochs.of(relpath), self.cat.epochs.resume_gen) == epoch:
                    return
        finally:
            self._preparing.discard(key)

    async def _once(self, relpath: str, space: tuple[int, int], alone: bool = True,
                    made: str = "when its epoch was set") -> None:
        """Open the current epoch's view of ``relpath`` without a handle and load its window 0 (a
        Parquet view read by the kernel: make its stage, if its file is read alone; of many, the
        ones read last would be made first, and dropped), so that the first read after an epoch
        change finds it ready (the view then waits among the idle ones)."""
        async def prepare(node: Node) -> None:
            if self.cat.passthrough.wants(node):
                if alone:
                    await self.cat.passthrough.stage(self.cat, node, made=made)
            elif node.view is not None and node.layout.n_windows:
                ref = self.cat.views.window(node, 0, ahead=True)
                self.prefetches += self.cat.windows.prefetch(ref.key, ref.nbytes, ref.loader, ref.work,
                                                              background=True)

        await self._with_view(relpath, space, None, prepare)

    def at_mount(self) -> None:
        """The mount started: if the mount of this root before it read files with stages
        (`Passthrough.last_order`), start the stage of the first of them at this mount's epoch
        now, while the job starts, and let `ahead` follow that order from the first open on."""
        first = self.cat.passthrough.last_order()
        if first is not None and self.cat.windows.nursery is not None:
            self.cat.windows.nursery.start_soon(functools.partial(
                self._prepare, first[0], first[1:], made="when the mount started (read first by the mount before)"))

    async def _with_view(self, relpath: str, space: tuple[int, int], epoch: int | None,
                         work: Callable[[Node], Awaitable[None]]) -> None:
        """Make the view of ``relpath`` at ``epoch`` (None: its current one) without a handle, and
        ``work`` on it; the view is then left idle.  Failures are left for the open to report."""
        try:
            probe = await self.cat.probe(relpath)
            if probe is None or probe.fmt is None:
                return
            node = await self.cat.entry(relpath, probe, space, epoch=epoch)
            if node.kind != VIEW or node.broken is not None or (epoch is not None and node.epoch != epoch):
                return
            node.opens += 1  # keeps the view from closing while it is being made
            try:
                if node.view is None:
                    await self.cat.tasks.run(("view", node.ino), functools.partial(self.cat.views.make, node))
                await work(node)
            finally:
                node.opens -= 1
                if node.opens == 0:
                    self.cat.views.retire(node)  # idle until its first open (or forgotten if it failed)
        except (ShuffleError, OSError, Reply) as e:
            log.debug("preparing %s (epoch %s): %s", relpath, "current" if epoch is None else epoch, e)
        except Exception:  # noqa: BLE001 -- a background task must never end the mount
            log.exception("preparing %s (epoch %s) failed", relpath, "current" if epoch is None else epoch)

    @property
    def building_ahead(self) -> int:
        """Stages being built ahead now, or waiting their turn (`ahead`)."""
        return len(self._ahead) + (self._building is not None)

    def ahead(self, node: Node) -> None:
        """``node``'s view was just opened with a stage (`serve.passthrough`): build the stages
        its reader will open next while this one is read (`Passthrough.next_of`: the same
        file's next epoch, or the next shards'), so that it finds them ready.  Up to `DEPTH`
        files ahead, never the opened file's own again (a file read alone: its next epoch only),
        one build at a time for the whole mount, on one thread (the readers have the other
        cores), the nearest first.  Not for resumed views, nor for a file whose next one is not
        known (shards in their first epoch: their next epoch's views would wait idle behind the
        shards read after them, and be dropped).  An epoch set to another number closes a next
        epoch's view unread (`Views.close_stale`).  Measured on 4 shards of 260 MiB read in turn
        with ``iter_batches``: 0.40-0.43x the source's rows/s when each shard's open waited for
        its stage, 0.59-0.72x with the next shard's built ahead; the first shard of each epoch
        still waited 0.12-0.15 s, its build started only at the last shard's open."""
        if node.key[5] or self.cat.windows.nursery is None:
            return
        this, epoch = (node.relpath, node.part, node.parts), node.epoch
        wanted = []
        for depth in range(self.DEPTH):
            nxt = self.cat.passthrough.next_of(this, epoch, node.epoch)  # orders known at this open
            if nxt is None or (nxt[0], *nxt[1]) == (node.relpath, node.part, node.parts) and depth:
                break
            wanted.append(nxt)
            this, epoch = (nxt[0], *nxt[1]), nxt[2]
        for i, (relpath, space, want) in enumerate(wanted):
            made = ("while the epoch before was read" if want != node.epoch
                    else "while a file before was read" if i else "while the file before was read")
            key = (relpath, *space)
            if self._building == (key, want):
                continue
            self._ahead[key] = (want, made)
        if self._ahead and self._building is None:
            self._building = ((), -1)
            self.cat.windows.nursery.start_soon(self._stage_ahead)

    async def _stage_ahead(self) -> None:
        """Build the stages `ahead` asked for, one at a time, the first asked first; a request
        for another epoch of a file made while it is built is built after it, not dropped."""
        async def stage(node: Node) -> None:
            await self.cat.passthrough.stage(self.cat, node, threads=1, made=made)
            self.staged_ahead += 1

        try:
            while self._ahead:
                key = next(iter(self._ahead))
                want, made = self._ahead.pop(key)
                self._building = (key, want)
                await self._after_read_ahead()
                await self._with_view(key[0], key[1:], want, stage)
        finally:
            self._building = None

    async def _after_read_ahead(self) -> None:
        """Wait while the stage opened last is asked from disk ahead of its reader
        (`Passthrough.reading_ahead`): a build beside it reads its copy from the same disk.  A
        stage kept by an earlier mount, read cold (1.02 GiB file, alternated runs): the epoch
        took 1.65-1.98 s with no build beside it, 1.75-2.92 s beside the next epoch's."""
        while self.cat.passthrough.reading_ahead:
            await trio.sleep(0.02)
