"""Which stage files exist, who reads them, and which to build next (``--stage-dir``).

Per staged file (or pool) the store keeps the stage of the rank's partition at the file's current
epoch, and builds the next epoch's in the background as soon as the current one is in use (kept
records copied from the current stage, received ones fetched from the shared source), so that
an epoch change finds it waiting.  The first stage of a file is copied from the source when its
first view opens.  A stage is dropped once no view reads it and its epoch is neither the current
one nor the next (an older one stays only as the base of a current stage not built yet).  The
stages of a mount live in a directory of their own under ``--stage-dir``, removed at unmount, or
by the next mount there if this one was killed (`scratch.held`).

`EpochBytes` counts the record bytes read per epoch from the shared source and from stages, for
every mount (a view without a stage reads everything from the source).  A stage's build counts
under the stage's epoch, whenever it runs.

Runs in the trio thread, except `StageStore.release` and `EpochBytes.add` (any thread) and the
builds (worker threads).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np
import trio

from .. import scratch
from ..errors import ShuffleError
from ..index.table import RecordIndex
from ..shared_tasks import SharedTasks
from .stage_file import Stage, StageCancelled, write_stage
from ..sources.base import Fetched, Source
from ..windows.view import Meter

log = logging.getLogger("shufflefs")

STAGE_PREFIX = "shufflefs-stage-"
"""A mount's stages live in ``--stage-dir``/``shufflefs-stage-<pid>-XXXXXXXX``."""


class EpochBytes:
    """Record bytes read per epoch from the shared source and from local stages, and requests
    made to a remote source (thread-safe).

    Only the `KEPT` epochs touched last are kept one by one (a long run sets thousands of epochs,
    and the stats must fit in one extended attribute); older ones add to ``earlier``."""

    KEPT = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: OrderedDict[int, list[int]] = OrderedDict()
        self._earlier = [0, 0, 0, 0]

    def add(self, epoch: int, source: int, stage: int, fetched: Fetched = Fetched()) -> None:
        with self._lock:
            got = self._by.get(epoch)
            if got is None:
                got = self._by[epoch] = [0, 0, 0, 0]
                while len(self._by) > self.KEPT:
                    _, old = self._by.popitem(last=False)
                    self._earlier = [a + b for a, b in zip(self._earlier, old)]
            else:
                self._by.move_to_end(epoch)
            got[0] += source
            got[1] += stage
            got[2] += fetched.requests
            got[3] += fetched.nbytes

    def meter(self, epoch: int) -> Meter:
        return functools.partial(self.add, epoch)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """The kept epochs by number; older ones summed under ``earlier`` once there are any."""
        with self._lock:
            out = {str(e): _counts(got) for e, got in sorted(self._by.items())}
            if any(self._earlier):
                out["earlier"] = _counts(self._earlier)
            return out


def _counts(got: list[int]) -> dict[str, int]:
    return {"source_bytes": got[0], "stage_bytes": got[1], "source_requests": got[2], "fetched_bytes": got[3]}


@dataclass(frozen=True)
class StageTarget:
    """A staged file (or pool) for this mount's rank."""

    file: Hashable
    """The file (or pool), whatever its version."""
    key: Hashable
    """The file's version: the stages of one key hold records of one offset table."""
    name: str
    index: RecordIndex
    partition: Callable[[int], np.ndarray]
    """Blocking: the rank's record ids at an epoch."""
    open_source: Callable[[], Source]
    """Blocking: the shared source, opened (and checked) for one build."""
    current: Callable[[], int]
    """The file's current epoch."""


class StageStore:
    """The stage files of one mount; `acquire` one per view, `release` it when the view closes."""

    def __init__(self, root: str | os.PathLike, counts: EpochBytes) -> None:
        os.makedirs(root, exist_ok=True)
        self.dir, self._hold = scratch.held(root, STAGE_PREFIX)  # a killed mount's go with the next mount
        self.counts = counts
        self.limiter = trio.CapacityLimiter(1)  # one build at a time: a stage is sequential I/O
        self.tasks = SharedTasks()
        self.stop = threading.Event()
        self.nursery: trio.Nursery | None = None
        self.built = self.failed = 0
        self._stages: dict[Hashable, dict[int, Stage]] = {}
        self._targets: dict[Hashable, StageTarget] = {}
        self._latest: dict[Hashable, Hashable] = {}  # file -> key of its newest version
        self._lock = threading.Lock()
        self._serial = 0

    async def acquire(self, target: StageTarget, epoch: int) -> Stage:
        """The stage of ``target`` at ``epoch`` with one more user, built now if need be; then
        the next epoch's starts building in the background."""
        self._targets[target.key] = target
        self._latest[target.file] = target.key
        while (stage := self._take(target.key, epoch)) is None:
            await self.tasks.run(("stage", target.key, epoch), functools.partial(self._build, target, epoch))
        self.tidy()
        if epoch == target.current():
            self._ahead(target, epoch + 1)
        return stage

    def release(self, stage: Stage) -> None:
        """A user is done with ``stage`` (any thread; `tidy` drops it when it may go)."""
        with self._lock:
            stage.users -= 1

    def _take(self, key: Hashable, epoch: int) -> Stage | None:
        with self._lock:
            stage = self._stages.get(key, {}).get(epoch)
            if stage is not None:
                stage.users += 1
            return stage

    def _base(self, key: Hashable, epoch: int) -> Stage | None:
        """The stage to copy kept records from (with a user): the newest older one, else the
        oldest newer one (an epoch read again)."""
        with self._lock:
            have = self._stages.get(key, {})
            older = [e for e in have if e < epoch]
            pick = max(older) if older else min(have, default=None)
            if pick is None:
                return None
            have[pick].users += 1
            return have[pick]

    async def _build(self, target: StageTarget, epoch: int) -> None:
        base = self._base(target.key, epoch)
        self._serial += 1
        path = os.path.join(self.dir, f"{self._serial:06d}-epoch{epoch}.stage")
        meter = self.counts.meter(epoch)

        def work() -> Stage:
            source = target.open_source()
            try:
                return write_stage(path, target.name, epoch, target.index, target.partition(epoch),
                                   source, base, self.stop, meter)
            finally:
                source.close()

        try:
            stage = await trio.to_thread.run_sync(work, limiter=self.limiter)
        finally:
            if base is not None:
                self.release(base)
        with self._lock:
            self._stages.setdefault(target.key, {})[epoch] = stage
        self.built += 1
        log.info("staged %s epoch %d: %d records, %d bytes (%s)", target.name, epoch, stage.records,
                 stage.nbytes, f"from epoch {base.epoch}'s stage and the source" if base else "from the source")
        if self.stop.is_set():
            self.close()

    def _ahead(self, target: StageTarget, epoch: int) -> None:
        key = ("stage", target.key, epoch)
        if self.nursery is None or self.stop.is_set() or self.tasks.running(key) \
                or epoch in self._stages.get(target.key, {}):
            return

        async def build() -> None:
            try:
                await self.tasks.run(key, functools.partial(self._build, target, epoch))
            except StageCancelled:
                return
            except (ShuffleError, OSError) as e:
                self.failed += 1
                log.warning("staging %s for epoch %d ahead failed (its first open will retry): %s",
                            target.name, epoch, e)
            except Exception:  # noqa: BLE001 -- a background task must never end the mount
                self.failed += 1
                log.exception("staging %s for epoch %d ahead failed", target.name, epoch)
            self.tidy()

        self.nursery.start_soon(build)

    def tidy(self) -> None:
        """Drop the stages no view reads that no epoch to come needs: not the current epoch's or
        the next one's (nor, while the current one is missing, the newest older one, its base),
        and none of a file version that was replaced."""
        for key in list(self._stages):
            target = self._targets[key]
            cur = target.current()
            with self._lock:
                have = self._stages[key]
                keep = {cur, cur + 1}
                older = [e for e in have if e < cur]
                if cur not in have and older:
                    keep.add(max(older))
                if self._latest.get(target.file) != key:
                    keep = set()
                gone = [e for e, s in have.items() if s.users <= 0 and e not in keep]
                stages = [have.pop(e) for e in gone]
                if not have:
                    del self._stages[key]
            for s in stages:
                s.drop()
                log.debug("dropped the stage of %s epoch %d", s.name, s.epoch)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            stages = [{"name": s.name, "epoch": s.epoch, "records": s.records, "bytes": s.nbytes, "readers": s.users}
                      for have in self._stages.values() for s in have.values()]
        return {"dir": self.dir, "stages": sorted(stages, key=lambda s: (s["name"], s["epoch"])),
                "built": self.built, "failed": self.failed}

    def close(self) -> None:
        """Stop building and remove every stage (at unmount)."""
        self.stop.set()
        with self._lock:
            stages = [s for have in self._stages.values() for s in have.values()]
            self._stages.clear()
        for s in stages:
            s.drop()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._hold >= 0:
            os.close(self._hold)
            self._hold = -1
