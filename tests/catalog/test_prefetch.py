"""Level: catalog (trio, no mount).

The window cache without FUSE: one load per window, buffers reused, the memory limit kept."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from shufflefs.windows.cache import HOLD_IDLE, WINDOWS, WindowCache

W = 1000  # bytes of every window of view "v"


def run(test) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache = WindowCache(trio.CapacityLimiter(2))
            cache.nursery = nursery
            cache.register("v", W)
            while not cache._warmed.is_set():  # the buffers faulted in ahead count until they are pooled
                await trio.sleep(0.001)
            await test(cache)
            nursery.cancel_scope.cancel()

    trio.run(main)


class Loads:
    """Loaders that fill window k with the byte k and remember which buffers they were given."""

    def __init__(self) -> None:
        self.done: list[int] = []
        self.buffers: set[int] = set()

    def __call__(self, k: int, fail: bool = False):
        def load(out: np.ndarray, scratch):
            if fail:
                raise OSError(5, "disk error")
            self.buffers.add(out.__array_interface__["data"][0])
            out[:W] = k
            self.done.append(k)
            return out[:W], scratch

        return load


async def read(cache: WindowCache, k: int, loads: Loads, hold: bool = False):
    slot = await cache.acquire(("v", k), W, loads(k))
    assert np.all(slot.data == k) and len(slot.data) == W
    if hold:
        cache.hold(slot)
    cache.release(slot)
    return slot


def within(cache: WindowCache) -> bool:
    return cache.resident + cache.pooled <= cache.limit == WINDOWS * W


def test_a_sequential_reader_reuses_three_buffers_and_never_reloads():
    async def test(cache: WindowCache) -> None:
        loads = Loads()
        held = None
        for k in range(20):
            slot = await read(cache, k, loads, hold=True)
            if held is not None:
                cache.unhold(held)
            held = slot
            assert cache.prefetch(("v", k + 1), W, loads(k + 1)) or ("v", k + 1) in cache
            assert within(cache)
            await trio.sleep(0.01)  # let the prefetch finish, as a reader would spend time in k
        assert loads.done == list(range(21))  # every window once: the prefetched ones were found
        assert len(loads.buffers) == WINDOWS  # the first three buffers, reused ever after
        assert cache.describe()["prefetched"] == 20

    run(test)


def test_prefetch_never_evicts_held_or_unread_windows_and_a_read_takes_a_held_ones_memory():
    async def test(cache: WindowCache) -> None:
        loads = Loads()
        a = await read(cache, 0, loads, hold=True)
        assert cache.prefetch(("v", 1), W, loads(1)) and cache.prefetch(("v", 2), W, loads(2))
        await trio.sleep(0.01)
        assert not cache.prefetch(("v", 3), W, loads(3))  # full of a held and two unread windows
        b = await read(cache, 3, loads, hold=True)  # a read takes an unread window's place
        assert ("v", 0) in cache and ("v", 3) in cache and within(cache)
        assert sum(("v", k) in cache for k in (1, 2)) == 1
        c = await read(cache, 4, loads, hold=True)
        d = await read(cache, 5, loads, hold=True)  # a fourth held window: the oldest gives way
        assert cache.resident <= cache.limit and cache.revoked == 1
        assert a.data is None and ("v", 0) not in cache  # its handle loads it again on its next read
        assert all(s.data is not None for s in (b, c, d))
        for slot in (a, b, c, d):
            cache.unhold(slot)
        assert within(cache)  # back under the limit once nobody holds them
        assert cache.prefetch(("v", 9), W, loads(9)) and within(cache)  # room from windows already read

    run(test)


def test_a_failed_load_reaches_the_reader_and_returns_its_memory():
    async def test(cache: WindowCache) -> None:
        loads = Loads()
        with pytest.raises(OSError):
            await cache.acquire(("v", 0), W, loads(0, fail=True))
        assert ("v", 0) not in cache and cache.resident == 0
        await read(cache, 0, loads)  # loaded again on the next read
        cache.unregister("v")
        assert cache.limit == 0 and cache.resident == 0 and cache.pooled == 0 and ("v", 0) not in cache

    run(test)


def test_a_failed_load_frees_its_buffer_without_waiting_for_the_garbage_collector():
    """The stored error must not keep the failed load's frames, which hold the window buffer."""
    buffers: list[weakref.ref] = []

    def failing(out: np.ndarray, scratch):
        buffers.append(weakref.ref(out.base if out.base is not None else out))
        raise OSError(5, "disk error")

    async def test(cache: WindowCache) -> None:
        for k in range(3):
            with pytest.raises(OSError, match="disk error"):
                await cache.acquire(("v", k), W, failing)
        # gone, or back in the free list for the next load (buffers faulted in ahead are reused)
        pooled = {id(b) for b in cache._free}
        assert len(buffers) == 3 and all(ref() is None or id(ref()) in pooled for ref in buffers)
        assert len({id(ref()) for ref in buffers if ref() is not None}) <= len(cache._free)

    gc.disable()
    try:
        run(test)
    finally:
        gc.enable()


def test_a_read_waits_for_a_held_window_instead_of_loading_over_the_limit():
    """Three handles hold three windows and keep reading them: a fourth read waits (memory stays
    within the limit) and loads as soon as one of them lets go."""
    async def test(cache: WindowCache) -> None:
        loads = Loads()
        held = [await read(cache, k, loads, hold=True) for k in range(3)]
        got: list = []

        async def fourth() -> None:
            got.append(await read(cache, 3, loads, hold=True))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fourth)
            for _ in range(5):  # the holders keep reading: their windows are not idle
                await trio.sleep(HOLD_IDLE / 4)
                for slot in held:
                    slot.used = trio.current_time()
                assert not got and cache.resident <= cache.limit and cache.revoked == 0
                assert not cache.prefetch(("v", 9), W, loads(9))  # a waiting read comes first
            cache.unhold(held[0])
        assert got and got[0].data is not None and cache.revoked == 0 and within(cache)

    run(test)


def test_a_held_window_left_unread_gives_way_to_a_waiting_read():
    async def test(cache: WindowCache) -> None:
        loads = Loads()
        held = [await read(cache, k, loads, hold=True) for k in range(3)]
        start = trio.current_time()
        await read(cache, 3, loads, hold=True)
        assert trio.current_time() - start >= HOLD_IDLE * 0.9
        assert cache.revoked == 1 and held[0].data is None  # the least recently read one
        assert cache.resident <= cache.limit

    run(test)


def test_a_load_counts_its_working_memory_until_it_ends():
    async def test(cache: WindowCache) -> None:
        started, finish = trio.Event(), threading.Event()

        def slow(out: np.ndarray, scratch):
            trio.from_thread.run_sync(started.set)
            finish.wait(10)
            out[:W] = 1
            return out[:W], scratch

        cache.register("v", W, work=W // 2)
        assert cache.limit == WINDOWS * W  # the work fits in the spare window
        cache.register("v", W, work=3 * W // 2)
        assert cache.limit == WINDOWS * W + W // 2  # beyond it: the limit grows by the difference
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cache.acquire, ("v", 0), W, slow, W // 2)
            await started.wait()
            assert cache.resident == W + W // 2  # the window and its load's work
            finish.set()
        assert cache.resident == W  # the work is given back when the load ends

    run(test)


def test_buffers_are_faulted_in_ahead_and_used_by_the_first_loads():
    """A view's first windows load into buffers touched on a worker thread while the mount waited
    for its first read (fresh memory costs more to write than a window build), within the limit."""
    async def test(cache: WindowCache) -> None:
        for _ in range(50):
            if len(cache._free) == WINDOWS - 1:  # the first load makes its own
                break
            await trio.sleep(0.01)
        assert len(cache._free) == WINDOWS - 1 and all(b.nbytes == W for b in cache._free) and within(cache)
        pooled = {b.__array_interface__["data"][0] for b in cache._free}
        loads = Loads()
        for k in range(WINDOWS - 1):
            await read(cache, k, loads)
        assert loads.buffers and loads.buffers <= pooled and within(cache)
        cache.register("big", 2 * W)  # a larger view: new buffers of its size, still within the limit
        await trio.sleep(0.2)
        assert cache.limit == WINDOWS * 2 * W and cache.resident + cache.pooled <= cache.limit
        assert any(b.nbytes == 2 * W for b in cache._free)

    run(test)


def test_a_buffer_being_faulted_in_counts_against_the_limit(monkeypatch):
    """Loads that start while a buffer is being faulted in ahead (a view's first read does not
    wait for it) leave it room: every live window buffer, in the cache, its free list or a worker
    thread, fits in the limit together."""
    import shufflefs.windows.cache as cache_module
    from shufflefs.windows.slots import new_buffer

    live, release = [0], threading.Event()

    def counted(nbytes: int) -> np.ndarray:
        buf = new_buffer(nbytes)
        live[0] += buf.nbytes
        weakref.finalize(buf, lambda n=buf.nbytes: live.__setitem__(0, live[0] - n))
        return buf

    def slow_touched(nbytes: int) -> np.ndarray:
        buf = counted(nbytes)
        release.wait(10)  # still being faulted in while the first loads run
        return buf

    monkeypatch.setattr(cache_module, "new_buffer", counted)
    monkeypatch.setattr(cache_module, "touched_buffer", slow_touched)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            cache = WindowCache(trio.CapacityLimiter(2))
            cache.nursery = nursery
            loads = Loads()
            for view in range(2):  # the second registers alone again: its buffers are faulted in anew
                release.clear()
                cache.register("v", W)
                await trio.sleep(0.05)  # the warming thread holds its buffer
                assert not cache._warmed.is_set() and live[0] >= W
                for k in range(4):
                    await read(cache, k, loads)
                    cache.prefetch(("v", k + 1), W, loads(k + 1))
                    await trio.sleep(0.02)
                    gc.collect()
                    assert live[0] <= cache.limit, (view, k, live[0], cache.limit)
                release.set()
                await trio.sleep(0.1)
                gc.collect()
                assert live[0] <= cache.limit
                cache.unregister("v")
                gc.collect()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_reads_waiting_for_memory_are_served_in_order():
    """Three handles hold the three windows that fit and keep reading them; a fourth read waits.
    When a holder moves on to its next window, the window it let go goes to the read that waited,
    never back to the holder that asks again at once: the holder now waits behind it, and every
    read gets memory in the order it asked, however often windows land meanwhile.
    Holds: SEMANTICS.md#memory-fair"""
    async def test(cache: WindowCache) -> None:
        loads = Loads()
        held = [await read(cache, k, loads, hold=True) for k in range(3)]
        granted: list[int] = []  # windows in the order they got memory (and started loading)
        pin = cache.pin
        cache.pin = lambda key, *args: (granted.append(key[1]), pin(key, *args))[1]

        async def reader(k: int, let_go: Any = None) -> None:
            if let_go is not None:
                cache.unhold(let_go)  # as `serve.reads` does: let go, then ask for the next window
            slot = await read(cache, k, loads, hold=True)
            await trio.sleep(0.01)
            cache.unhold(slot)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, 10)
            await trio.testing.wait_all_tasks_blocked()
            assert not granted  # the memory is held by handles still reading
            for slot in held:
                slot.used = trio.current_time()
            for i, slot in enumerate(held):  # each holder moves on to its next window
                nursery.start_soon(reader, 3 + i, slot)
                await trio.testing.wait_all_tasks_blocked()  # it has asked for memory
        assert granted == [10, 3, 4, 5], granted
        assert cache.revoked == 0 and cache.over_limit == 0 and within(cache)

    run(test)
