"""Level: pure (no mount).  The allocator's heap tops (`heap.keep_top`): a mount that makes
Parquet stages keeps more free at the top of its heaps, and never goes back to fewer."""

from __future__ import annotations

from shufflefs.windows import heap


def test_heap_tops_only_grow(monkeypatch):
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(heap, "_mallopt", lambda param, value, name: calls.append((param, value)))
    monkeypatch.setattr(heap, "_kept", [0])
    heap.fix_allocator()
    assert (heap.M_TRIM_THRESHOLD, heap.TRIM_THRESHOLD) in calls
    assert (heap.M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD) in calls and (heap.M_ARENA_MAX, heap.ARENAS) in calls
    calls.clear()
    heap.keep_top(heap.STAGE_TRIM_THRESHOLD)
    heap.keep_top(heap.TRIM_THRESHOLD)  # a later mount setting never lowers it
    heap.keep_top(heap.STAGE_TRIM_THRESHOLD)
    assert calls == [(heap.M_TRIM_THRESHOLD, heap.STAGE_TRIM_THRESHOLD)]
