"""Level: pure (no mount, no daemon).

The working memory of partial local shuffling, measured with tracemalloc (numpy reports its
arrays to it): a rank's partition, its stage build and a staged window's placement each hold
their result and a few MiB besides, never tens of bytes per record of the partition or window
(the daemon's memory bound leaves no room for that)."""

from __future__ import annotations

import tracemalloc
from typing import Any, Callable

import numpy as np
import pytest

from shufflefs.index.table import RecordIndex
from shufflefs.sources.base import Runs
from shufflefs.stages.stage_file import STAGE_CHUNK, StagedSource, write_stage
from shufflefs.strategies.exchange import Exchange
from shufflefs.strategies.base import ShuffleSpec
from shufflefs.strategies.partial_local import PartialLocalPlan
from shufflefs.windows.view import READ_CHUNK

MiB = 1 << 20
N = 2_000_000
SLACK = 8 * MiB
"""Temporaries beside the result: a chunk's worth of int64 arrays and the interpreter's own."""


def traced_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the most memory it held at once beyond what was allocated before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def exchange(world: int, n: int = N) -> Exchange:
    firsts = np.unique(np.append(np.arange(0, n, 4096), n))
    return Exchange(firsts, np.random.default_rng(1).permutation(len(firsts) - 1), world, 0.2, 7)


@pytest.mark.parametrize("world,epoch", [(1, 0), (2, 0), (2, 3), (4, 5)])
def test_a_partition_holds_its_ids_and_a_few_mib(world, epoch):
    ex = exchange(world)
    part, peak = traced_peak(lambda: ex.partition(0, epoch))
    assert len(part) == int(ex.sizes[0])
    assert peak <= part.nbytes + SLACK, f"{peak / len(part):.0f} bytes per record"


def records(n: int) -> RecordIndex:
    """An offset table of ``n`` records of 1..40 bytes, without a file."""
    bounds = np.concatenate(([0], np.cumsum(1 + np.arange(n, dtype=np.int64) % 40)))
    return RecordIndex(int(bounds[-1]), bounds)


class NullSource:
    """A source of zeros (/dev/zero) with a descriptor, as the compiled gather reads."""

    def __init__(self) -> None:
        self.fd = open("/dev/zero", "rb")

    def place(self, index: Any, first: np.ndarray, count: np.ndarray) -> Runs:
        return Runs(first, count, np.full(len(first), self.fd.fileno(), np.int64), np.zeros(len(first), np.int64))

    def file_of(self, fd: int) -> Any:
        return self

    def verify_read(self, offset: int | None) -> None:
        pass

    def ended(self, offset: int) -> None:
        raise AssertionError("ended")

    def close(self) -> None:
        self.fd.close()


@pytest.mark.parametrize("world", [1, 2])
def test_a_stage_build_holds_the_sorted_partition_one_chunk_and_its_map(tmp_path, world):
    index = records(N)
    ex = exchange(world)
    ids = ex.partition(0, 3)
    source = NullSource()
    try:
        stage, peak = traced_peak(lambda: write_stage(str(tmp_path / "s"), "a", 3, index, ids, source))
        runs = sum(a.nbytes for a in (stage.map.first, stage.map.count, stage.map.shift))
        assert stage.records == len(ids)
        assert peak <= ids.nbytes + runs + STAGE_CHUNK + READ_CHUNK + SLACK, \
            f"{peak / MiB:.0f} MiB for {len(ids)} records (map {runs / MiB:.0f} MiB)"
        # a dense window placed in the stage: the runs it returns (and their pieces) and a few MiB
        window = np.sort(np.random.default_rng(2).permutation(ids)[: len(ids) * 9 // 10])
        starts = np.flatnonzero(np.diff(window, prepend=-2) != 1)
        first, count = window[starts].astype(np.int64), np.diff(np.append(starts, len(window)))
        staged = StagedSource(source, stage, lambda: None)
        runs_out, peak = traced_peak(lambda: staged.place(index, first, count))
        out = sum(getattr(runs_out, f).nbytes for f in ("first", "count", "fd", "shift"))
        assert int(runs_out.count.sum()) == len(window)
        assert peak <= 2 * out + SLACK, f"{peak / MiB:.0f} MiB placing {len(window)} records ({out / MiB:.0f} MiB of runs)"
        stage.drop()
    finally:
        source.close()


def test_a_pls_plan_build_holds_its_order_and_a_few_mib():
    index = records(N)
    spec = ShuffleSpec(strategy="pls", seed=3, block_size=64 << 10, buffer=8 * MiB, exchange=0.2)
    plan, peak = traced_peak(lambda: PartialLocalPlan(index, spec, 4, 1, 2))
    assert peak <= plan.order.nbytes + SLACK, f"{peak / len(plan.order):.0f} bytes per record"
