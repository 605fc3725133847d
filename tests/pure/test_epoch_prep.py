"""Level: pure (no mount).  The next epoch's stage built ahead (`EpochPrep.ahead`): a request
made while another is being built waits for it and is then built, the newest one only; none is
dropped (the stage of the epoch opened last would otherwise be made only when its epoch is set)."""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from shufflefs.serve.epoch_prep import EpochPrep


def test_a_request_made_while_a_build_runs_is_built_after_it() -> None:
    built: list[int] = []
    release = trio.Event()

    async def with_view(relpath, space, epoch, work) -> None:
        built.append(epoch)
        if len(built) == 1:
            await release.wait()  # the first build is slow: requests arrive meanwhile

    async def main() -> None:
        prep = EpochPrep(SimpleNamespace())
        prep._with_view = with_view  # type: ignore[method-assign]
        async with trio.open_nursery() as n:
            n.start_soon(prep._stage_ahead, "a.parquet", (0, 1), 31)
            await trio.testing.wait_all_tasks_blocked()
            for epoch in (41, 51):  # one after the other (trio runs tasks started together in any order)
                n.start_soon(prep._stage_ahead, "a.parquet", (0, 1), epoch)
                await trio.testing.wait_all_tasks_blocked()
            assert built == [31] and prep.building_ahead == 1
            n.start_soon(prep._stage_ahead, "b.parquet", (0, 1), 7)  # another file: not held up
            await trio.testing.wait_all_tasks_blocked()
            assert built == [31, 7]
            release.set()
        assert built == [31, 7, 51] and prep.building_ahead == 0

    trio.run(main)
