"""Level: catalog (trio, no mount).

The members of a pool are checked at every open of a shard (`serve.versions`): one reading of
their attributes serves the opens that arrived before it started, and an open never takes a
reading that started before it arrived (it could predate the change the open must see)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import trio

from shufflefs.index.table import SourceStamp
from shufflefs.pools.lookup import PoolEntry
from shufflefs.pools.shards import ShardSet
from shufflefs.serve.versions import MemberVersions
from shufflefs.serve.workers import Workers
from shufflefs.sources.local import LocalStore


class Counted(LocalStore):
    """Readings of many members stat them, then block until ``go`` is set (a slow reading)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.started = 0
        self.go = threading.Event()

    def stat_many(self, relpaths):
        found = super().stat_many(relpaths)
        self.started += 1
        self.go.wait(10)
        return found


def test_opens_share_a_reading_that_started_after_they_arrived(tmp_path: Path) -> None:
    names = tuple(f"part-{i:05d}.jsonl" for i in range(64))
    for n in names:
        (tmp_path / n).write_bytes(b'{"a": 1}\n')
    store = Counted(str(tmp_path))
    stamps = tuple(SourceStamp.of(s) for s in LocalStore.stat_many(store, names))
    pool = ShardSet("part-*.jsonl", names, "lines")
    entry = PoolEntry(pool, 0, stamps)
    versions = MemberVersions(store, Workers(), None, None)
    got: dict[str, tuple] = {}

    async def check(name: str) -> None:
        got[name] = await versions.current(entry)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(check, "first")
            while store.started < 1:
                await trio.sleep(0.001)
            # the first reading runs; a change now, and the opens that arrive after it
            with open(tmp_path / names[5], "ab") as f:
                f.write(b'{"a": 2}\n')
            for i in range(20):
                nursery.start_soon(check, f"later{i}")
            await trio.sleep(0.05)
            assert store.started == 1  # they wait for the next reading, all of them for one
            store.go.set()
        assert versions.readings == 2 and store.started == 2

    trio.run(main)
    assert got["first"] == stamps  # started before the change
    now = SourceStamp.of(os.stat(tmp_path / names[5]))
    for i in range(20):  # every later open saw the change, and the unchanged stamps are the same objects
        assert got[f"later{i}"][5] == now and got[f"later{i}"] is got["later0"]
        assert all(a is b for j, (a, b) in enumerate(zip(got[f"later{i}"], stamps)) if j != 5)


def test_a_reading_that_could_not_tell_is_an_error_not_a_change(tmp_path: Path) -> None:
    """A reading past its deadline learned nothing about the members: the open gets ETIMEDOUT
    (logged by the catalog), never ESTALE, which would tell the kernel a member changed.  A member
    really changed still answers False.  Holds: SEMANTICS.md#errors-etimedout"""
    import errno

    import pytest

    names = tuple(f"part-{i:05d}.jsonl" for i in range(4))
    for n in names:
        (tmp_path / n).write_bytes(b'{"a": 1}\n')
    store = Counted(str(tmp_path))
    stamps = tuple(SourceStamp.of(s) for s in LocalStore.stat_many(store, names))
    entry = PoolEntry(ShardSet("part-*.jsonl", names, "lines"), 0, stamps)
    versions = MemberVersions(store, Workers(meta_deadline=0.2), None, None)
    with pytest.raises(OSError) as e:
        trio.run(versions.unchanged, entry)  # stat_many waits for `go` past the deadline
    assert e.value.errno == errno.ETIMEDOUT
    store.go.set()
    assert trio.run(versions.unchanged, entry) is True
    with open(tmp_path / names[2], "ab") as f:
        f.write(b'{"a": 2}\n')
    assert trio.run(versions.unchanged, entry) is False
