"""Level: catalog (trio, no mount).

A read whose window cannot be loaded (its source hangs) ends at the window deadline with
ETIMEDOUT instead of waiting for ever, and the view reads again once the source answers.
Holds: SEMANTICS.md#deadlines-window"""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from test_catalog import SPEC, RemoteLike, jsonl, lookup, reference
from shufflefs.config import MountConfig
from shufflefs.serve.catalog import Catalog
from shufflefs.serve.nodes import Reply
from shufflefs.strategies import ShuffleSpec


class Hanging(RemoteLike):
    """Window reads block while ``hang`` is set (a stopped network filesystem)."""

    hang = threading.Event()
    go = threading.Event()

    class Source(RemoteLike.Source):
        def read_runs(self, *args: Any, **kwargs: Any) -> Any:
            if Hanging.hang.is_set():
                Hanging.go.wait(30)
            return self.inner.read_runs(*args, **kwargs)

    def open(self, relpath: str, stamp: Any) -> Any:
        return Hanging.Source(super().open(relpath, stamp).inner)


def test_a_read_on_a_hung_source_ends_at_the_window_deadline(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_bytes(jsonl(3000))
    cfg = MountConfig(src, tmp_path / "mnt", spec=ShuffleSpec(strategy="corgipile", **SPEC), cache_dir=tmp_path / "c")
    Hanging.hang.clear()
    Hanging.go.clear()

    whole = reference(src / "a.jsonl", cfg.spec, 0)
    far = len(whole) // 2

    async def main() -> tuple[int, bytes]:
        cat = Catalog(cfg, Hanging(str(src)))
        cat.workers.window_deadline = 0.5
        try:
            async with trio.open_nursery() as nursery:
                cat.start(nursery)
                node = await lookup(cat, "a.jsonl")
                h = await cat.open(node)
                Hanging.hang.set()  # before any window of the view is loaded
                with trio.fail_after(10):
                    with pytest.raises(Reply) as e:
                        await cat.read(h, far, 10)
                Hanging.go.set()  # the source answers again
                with trio.fail_after(10):
                    again = bytes(await cat.read(h, far, 10))
                cat.release(h)
                nursery.cancel_scope.cancel()
            return e.value.errno, again
        finally:
            Hanging.hang.clear()
            Hanging.go.set()
            cat.stopping()
            cat.shutdown()

    code, again = trio.run(main)
    assert code == errno.ETIMEDOUT
    assert again == whole[far: far + 10]


def test_a_read_that_waits_for_memory_past_the_deadline_names_memory_pressure(tmp_path: Path) -> None:
    """Three handles hold the three windows that fit and keep reading them; a fourth handle's read
    waits for memory past the window deadline: ETIMEDOUT, and the log line and the path's error
    name memory pressure (the limit, what holds it), not the source.
    Holds: SEMANTICS.md#memory-fair, SEMANTICS.md#deadlines-window"""
    src = tmp_path / "src"
    src.mkdir()
    # records of 1 KB: a window's load works with little memory besides the window, so three fit
    (src / "a.jsonl").write_bytes(b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * 1000) for i in range(300)))
    cfg = MountConfig(src, tmp_path / "mnt", spec=ShuffleSpec(strategy="corgipile", **SPEC), cache_dir=tmp_path / "c")

    async def main() -> tuple[int, str]:
        cat = Catalog(cfg)
        cat.workers.window_deadline = 0.5
        try:
            async with trio.open_nursery() as nursery:
                cat.start(nursery)
                node = await lookup(cat, "a.jsonl")
                handles = [await cat.open(node) for _ in range(4)]
                starts = node.layout.window_starts
                assert len(starts) > 5
                done = trio.Event()

                async def keep_reading(h: Any, k: int) -> None:
                    while not done.is_set():  # a reader still at work in its window
                        await cat.read(h, int(starts[k]), 10)
                        await trio.sleep(0.02)

                for k, h in enumerate(handles[:3]):
                    await cat.read(h, int(starts[k]), 10)
                    nursery.start_soon(keep_reading, h, k)
                with trio.fail_after(10), pytest.raises(Reply) as e:
                    await cat.read(handles[3], int(starts[3]), 10)
                done.set()
                for h in handles:
                    cat.release(h)
                nursery.cancel_scope.cancel()
            return e.value.errno, cat.stats.last_errors[-1]
        finally:
            cat.stopping()
            cat.shutdown()

    code, line = trio.run(main)
    assert code == errno.ETIMEDOUT
    assert "no memory for window 3 of a.jsonl" in line and "memory pressure" in line, line
    assert "3 held by open handles" in line and "source" not in line, line
