"""Level: pure (no mount).  Stages built ahead (`EpochPrep.ahead`): the next files' stages, up to
two ahead of the one opened, one build at a time for the mount, the nearest first; a request made
while another is being built waits for it and is then built, the newest epoch only, none dropped
(the stage of the epoch opened last would otherwise be made only when its epoch is set)."""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from shufflefs.serve.epoch_prep import EpochPrep


def _prep(nursery: trio.Nursery, order: list[str]) -> tuple[EpochPrep, list[tuple[str, int, str]], list[trio.Event]]:
    """A prep whose reader opens the files of ``order`` in turn every epoch (one file: read alone);
    each build records (file, epoch, made) and, while ``gates`` holds an event, waits for it."""
    built: list[tuple[str, int, str]] = []
    gates: list[trio.Event] = []
    running = [0]

    def next_of(this: tuple, epoch: int, known: int) -> tuple[str, tuple[int, int], int]:
        i = order.index(this[0]) + 1
        return (order[i], (0, 1), epoch) if i < len(order) else (order[0], (0, 1), epoch + 1)

    async def stage(cat, node, threads: int, made: str) -> None:
        assert threads == 1
        built.append((node.relpath, node.epoch, made))

    async def with_view(relpath, space, epoch, work) -> None:
        running[0] += 1
        assert running[0] == 1, "two builds ahead at once"
        try:
            await work(SimpleNamespace(relpath=relpath, epoch=epoch))
            if gates:
                await gates.pop(0).wait()
        finally:
            running[0] -= 1

    cat = SimpleNamespace(windows=SimpleNamespace(nursery=nursery),
                          passthrough=SimpleNamespace(next_of=next_of, stage=stage, reading_ahead=False))
    prep = EpochPrep(cat)
    prep._with_view = with_view  # type: ignore[method-assign]
    return prep, built, gates


def opened(relpath: str, epoch: int) -> SimpleNamespace:
    return SimpleNamespace(relpath=relpath, part=0, parts=1, epoch=epoch, key=(relpath, 0, 1, epoch, 0, None))


def test_a_request_made_while_a_build_runs_is_built_after_it_the_newest_only() -> None:
    async def main() -> None:
        async with trio.open_nursery() as n:
            prep, built, gates = _prep(n, ["a.parquet"])
            release = trio.Event()
            gates.append(release)  # the first build is slow: requests arrive meanwhile
            prep.ahead(opened("a.parquet", 30))
            await trio.testing.wait_all_tasks_blocked()
            for epoch in (40, 50):
                prep.ahead(opened("a.parquet", epoch))
                await trio.testing.wait_all_tasks_blocked()
            assert [b[1] for b in built] == [31] and prep.building_ahead == 2
            release.set()
        assert [b[1] for b in built] == [31, 51] and prep.building_ahead == 0
        assert {b[2] for b in built} == {"while the epoch before was read"}  # a file read alone: never 2 ahead

    trio.run(main)


def test_shards_read_in_turn_get_the_next_two_built_one_at_a_time_nearest_first() -> None:
    async def main() -> None:
        async with trio.open_nursery() as n:
            prep, built, gates = _prep(n, ["s0", "s1", "s2", "s3"])
            release = trio.Event()
            gates.append(release)
            prep.ahead(opened("s0", 5))
            await trio.testing.wait_all_tasks_blocked()
            assert built == [("s1", 5, "while the file before was read")]
            prep.ahead(opened("s1", 5))  # opened while s2 waits its turn: s2 and s3 asked for again
            await trio.testing.wait_all_tasks_blocked()
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert built[1:] == [("s2", 5, "while the file before was read"), ("s3", 5, "while a file before was read")]
            prep.ahead(opened("s3", 5))  # the last shard: the next epoch's first two
            await trio.testing.wait_all_tasks_blocked()
            epoch_before = "while the epoch before was read"
            assert built[3:] == [("s0", 6, epoch_before), ("s1", 6, epoch_before)]
        assert prep.building_ahead == 0

    trio.run(main)


def test_a_resumed_view_gets_nothing_built_ahead() -> None:
    async def main() -> None:
        async with trio.open_nursery() as n:
            prep, built, _ = _prep(n, ["s0", "s1"])
            node = opened("s0", 3)
            node.key = ("s0", 0, 1, 3, 0, "resumed")
            prep.ahead(node)
            await trio.testing.wait_all_tasks_blocked()
        assert built == [] and prep.building_ahead == 0

    trio.run(main)


def test_a_build_ahead_starts_once_the_opened_stage_is_no_longer_read_from_disk_ahead() -> None:
    """The stage just opened is being asked from disk for its reader (a stage kept by an earlier
    mount, read cold): the next one's build, which reads its copy from the same disk, waits."""
    async def main() -> None:
        async with trio.open_nursery() as n:
            prep, built, _ = _prep(n, ["a.parquet"])
            passthrough = prep.cat.passthrough  # the stage opened last is read from disk ahead
            passthrough.reading_ahead = True
            prep.ahead(opened("a.parquet", 7))
            await trio.sleep(0.2)
            assert built == [] and prep.building_ahead == 1
            passthrough.reading_ahead = False
            await trio.sleep(0.1)
            assert [b[1] for b in built] == [8]
        assert prep.building_ahead == 0

    trio.run(main)
