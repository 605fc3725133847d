"""Level: pure (no mount, no daemon).

Plans' memory: two epochs' record-level plans of a file fit, a third waits until one is let go
(an unused one is dropped first), readers that keep loading windows keep it waiting, and without
any progress it is built anyway after `PLAN_WAIT`."""

from __future__ import annotations

import numpy as np
import trio

from shufflefs.serve import plan_memory
from shufflefs.serve.plan_memory import PlanMemory, plan_estimate, plan_nbytes
from shufflefs.index.table import RecordIndex
from shufflefs.strategies import ShuffleSpec, make_plan

N = 1_000_000
NEED = plan_estimate("full", False, N)


def test_estimates_match_what_plans_hold():
    bounds = np.arange(0, 10 * 20_001, 10, dtype=np.int64)
    index = RecordIndex(bounds=bounds, size=int(bounds[-1]))
    full = make_plan(index, ShuffleSpec(strategy="full", buffer=1 << 16), 1)
    assert plan_estimate("full", False, index.n) <= plan_nbytes(full) <= plan_estimate("full", False, index.n) + (1 << 16)
    corgi = make_plan(index, ShuffleSpec(strategy="corgipile", buffer=1 << 16), 1)
    assert plan_estimate("corgipile", False, index.n) == 0 and plan_nbytes(corgi) < index.n


def test_a_third_epoch_waits_for_a_plan_to_be_let_go():
    async def main() -> None:
        mem = PlanMemory()
        never = lambda: False  # noqa: E731
        await mem.admit(1, "f", N, NEED, never)
        await mem.admit(2, "f", N, NEED, never)  # two epochs of one file fit
        admitted = []

        async def third() -> None:
            await mem.admit(4, "f", N, NEED, never)
            admitted.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(third)
            await trio.sleep(0.3)
            assert not admitted and mem.waited == 1
            mem.release(1)
        assert admitted and mem.over == 0 and mem.describe()["plans"] == 2
        with trio.fail_after(1):
            await mem.admit(5, "g", N, NEED, never)  # another file brings its own room

    trio.run(main)


def test_an_unused_plan_is_dropped_before_anyone_waits():
    async def main() -> None:
        mem = PlanMemory()
        await mem.admit(1, "f", N, NEED, lambda: False)
        await mem.admit(2, "f", N, NEED, lambda: False)

        def drop() -> bool:
            mem.release(mem.holders()[0])
            return True

        with trio.fail_after(1):
            await mem.admit(3, "f", N, NEED, drop)
        assert mem.holders() == [2, 3] and mem.waited == 0

    trio.run(main)


def test_the_wait_lasts_while_readers_progress_and_ends_without_progress(monkeypatch):
    monkeypatch.setattr(plan_memory, "PLAN_WAIT", 0.3)

    async def main() -> None:
        mem = PlanMemory()
        for holder in (1, 2):
            await mem.admit(holder, "f", N, NEED, lambda: False)
        loads = [0]
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            async def progress() -> None:
                while trio.current_time() - start < 0.9:
                    loads[0] += 1
                    await trio.sleep(0.05)

            nursery.start_soon(progress)
            await mem.admit(3, "f", N, NEED, lambda: False, lambda: loads[0])
        took = trio.current_time() - start
        assert took >= 0.8 + 0.25, took  # waited while windows were loaded (0.9 s), then PLAN_WAIT more
        assert mem.over == 1 and mem.describe()["plans"] == 3

    trio.run(main)
