"""Level: pure (no FUSE).

Whether a view drops its windows' source pages from the page cache (`sources.cache_mode`): the
room the page cache has (machine memory, cgroup v1/v2 limits of the cgroup and its ancestors),
the choice per file, and that a view that drops serves the same bytes and drops exactly its
window's runs, after the window is built.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from shufflefs.index.table import RecordIndex, SourceStamp
from shufflefs.sources import cache_mode
from shufflefs.sources.cache_mode import Room, SourceCache, cgroup_limit, choose, room
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.windows import view

GiB = 1 << 30
MEMINFO = "MemTotal:       16777216 kB\nMemFree:         1000 kB\n"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_cgroup_v1_limit_is_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path):
    root = _tree(tmp_path, {"memory/memory.limit_in_bytes": "9223372036854771712\n",
                            "memory/jobs/memory.limit_in_bytes": str(3 * GiB),
                            "memory/jobs/a/memory.limit_in_bytes": "9223372036854771712\n"})
    text = "9:name=systemd:/\n4:memory:/jobs/a\n0::/\n"
    assert cgroup_limit(text, root) == (3 * GiB, str(root / "memory/jobs/memory.limit_in_bytes"))
    (root / "memory/jobs/a/memory.limit_in_bytes").write_text(str(GiB))
    assert cgroup_limit(text, root)[0] == GiB
    assert cgroup_limit("4:memory:/\n", root) is None  # the root's "no limit" is a huge number


def test_cgroup_v2_limit_and_no_limit(tmp_path):
    root = _tree(tmp_path, {"svc/memory.max": "max\n", "svc/job/memory.max": "536870912\n"})
    assert cgroup_limit("0::/svc/job\n", root) == (512 << 20, str(root / "svc/job/memory.max"))
    assert cgroup_limit("0::/svc\n", root) is None
    hybrid = _tree(tmp_path / "h", {"unified/x/memory.max": "1048576", "memory/.keep": ""})
    assert cgroup_limit("0::/x\n", hybrid) == (1 << 20, str(hybrid / "unified/x/memory.max"))


def test_the_room_is_the_machine_or_the_cgroup_whichever_is_smaller(tmp_path):
    root = _tree(tmp_path, {"memory/j/memory.limit_in_bytes": str(GiB)})
    got = room("4:memory:/j\n", MEMINFO, root)
    assert got.nbytes == GiB and "cgroup" in got.where and "memory.limit_in_bytes" in got.where
    (root / "memory/j/memory.limit_in_bytes").write_text(str(64 * GiB))
    assert room("4:memory:/j\n", MEMINFO, root) == Room(16 * GiB, "MemTotal")
    assert room("", MEMINFO, root) == Room(16 * GiB, "MemTotal")


def test_auto_bypasses_or_drops_the_cache_only_for_a_file_whose_source_and_view_do_not_both_fit():
    space = Room(2 * GiB, "cgroup limit x")
    assert choose(GiB, space)[0] == "keep"  # 2 x 1 GiB fits 2 GiB
    assert choose(GiB + 1, space)[0] == "direct"
    assert choose(GiB + 1, space, direct=False)[0] == "drop"  # a pool, tar, a remote source
    assert choose(GiB + 1, space, resident=0.99) == ("keep", "source already cached")
    assert choose(GiB + 1, space, resident=0.5)[0] == "direct"
    assert choose(10, space, "direct", direct=False)[0] == "drop"
    assert choose(8 * GiB, Room(0, "unknown"))[0] == "keep"  # no idea of the memory: as before


def test_a_forced_mode_wins_and_a_bad_one_is_refused():
    space = Room(2 * GiB, "MemTotal")
    assert choose(10, space, "drop") == ("drop", "--source-cache")
    assert choose(100 * GiB, space, "keep") == ("keep", "--source-cache")
    with pytest.raises(ValueError, match="auto, keep, drop"):
        choose(10, space, "always")
    with pytest.raises(ValueError):
        SourceCache("sometimes", space)


def test_residency_is_probed_only_when_the_file_does_not_fit():
    asked = []

    def resident() -> float:
        asked.append(1)
        return 0.0

    cache = SourceCache("auto", Room(4 * GiB, "MemTotal"))
    assert cache.decide(GiB, resident) == "keep" and not asked
    assert cache.decide(3 * GiB, resident) == cache_mode.AUTO_LARGE and asked == [1]
    assert SourceCache("keep", Room(1, "MemTotal")).decide(3 * GiB, resident) == "keep" and asked == [1]
    assert cache.direct_for(64 << 20, 512) and not cache.direct_for(64 << 20, 1)  # 128 KiB blocks; `none`
    assert SourceCache("direct", Room(1, "MemTotal")).direct_for(64 << 20, 1)  # forced: every window
    got = cache.describe()
    assert got["views"] == {"keep: source and view fit the page cache": 1,
                            f"{cache_mode.AUTO_LARGE}: source and view do not fit the page cache": 1}
    assert got["room"] == 4 * GiB and got["option"] == "auto" and got["dropped_bytes"] == 0


def test_this_room_reads_this_process():
    got = cache_mode.this_room()
    assert got.nbytes > 0 and got.nbytes <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


RECORDS, SIZE = 16384, 100


@pytest.fixture
def source(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, RECORDS * SIZE, dtype=np.uint8)
    path = tmp_path / "records.bin"
    path.write_bytes(data.tobytes())
    bounds = np.arange(0, RECORDS * SIZE + 1, SIZE, dtype=np.int64)
    return str(path), RecordIndex(len(data), bounds, False, SourceStamp.of(os.stat(path))), data


@pytest.mark.parametrize("strategy", ["none", "stratified", "corgipile", "full"])
def test_a_view_that_drops_serves_the_same_bytes_and_drops_exactly_its_runs(source, strategy, monkeypatch):
    """Holds: SEMANTICS.md#views-source-cache"""
    if view._build_window is None:
        pytest.skip("compiled window build not built")
    monkeypatch.setattr(view, "MAP_RUN", 0)  # preads, as a file outside the page cache is read
    path, index, data = source
    plan = make_plan(index, ShuffleSpec(strategy=strategy, block_size=65536, buffer=256 * 1024), epoch=1)
    keep = view.View(path, index, plan, source_cache=SourceCache("keep", Room(GiB, "MemTotal")))
    dropping = SourceCache("drop", Room(GiB, "MemTotal"))
    drop = view.View(path, index, plan, source_cache=dropping)
    dropped: list[tuple[int, int]] = []
    real = drop.source.drop

    def record(idx, first, count):
        b = idx.bounds
        dropped.extend(zip(b[first].tolist(), b[first + count].tolist()))
        real(idx, first, count)

    drop.source.drop = record
    try:
        assert not keep.drop_behind and drop.drop_behind
        for k in range(plan.n_windows):
            before = len(dropped)
            a, _ = keep.load_window(k)
            b, _ = drop.load_window(k)
            assert a.tobytes() == b.tobytes()
            runs = plan.window_runs(k)
            if runs is None:  # record-level windows: runs of a record or two, nothing dropped
                assert len(dropped) == before
                continue
            bb = index.bounds
            assert dropped[before:] == list(zip(bb[runs[0]].tolist(), bb[runs[0] + runs[1]].tolist()))
        whole = b"".join(keep.load_window(k)[0].tobytes() for k in range(plan.n_windows))
        assert sorted(whole[i: i + SIZE] for i in range(0, len(whole), SIZE)) == sorted(
            data[i: i + SIZE].tobytes() for i in range(0, len(data), SIZE))
        if plan.window_runs(0) is not None:
            assert dropping.dropped_bytes == len(data)
    finally:
        keep.close()
        drop.close()


@pytest.mark.parametrize("strategy", ["none", "stratified", "corgipile"])
def test_direct_loads_serve_the_same_bytes_and_a_changed_source_is_stale(source, strategy, monkeypatch):
    """Holds: SEMANTICS.md#views-source-cache"""
    if view._build_window is None:
        pytest.skip("compiled window build not built")
    from shufflefs.errors import StaleSourceError

    path, index, data = source
    plan = make_plan(index, ShuffleSpec(strategy=strategy, block_size=65536, buffer=256 * 1024), epoch=2)
    keep = view.View(path, index, plan, source_cache=SourceCache("keep", Room(GiB, "MemTotal")))
    direct = view.View(path, index, plan, source_cache=SourceCache("direct", Room(GiB, "MemTotal")))
    monkeypatch.setattr(view, "CACHED", 2.0)  # never "cached": every window by O_DIRECT reads
    loaded = []
    real = direct._load_direct
    monkeypatch.setattr(direct, "_load_direct", lambda *a: loaded.append(1) or real(*a))
    try:
        assert direct.direct and not keep.direct
        for k in range(plan.n_windows):
            assert keep.load_window(k)[0].tobytes() == direct.load_window(k)[0].tobytes()
        assert len(loaded) == plan.n_windows
        with open(path, "r+b") as f:  # same size, new bytes: the stamp's ctime tells
            f.write(b"x" * 100)
        with pytest.raises(StaleSourceError):
            direct.load_window(0)
        os.truncate(path, len(data) // 3)
        with pytest.raises(StaleSourceError):
            direct.load_window(plan.n_windows - 1)
    finally:
        keep.close()
        direct.close()


def test_a_direct_view_counts_its_buffer_in_the_load_work(source):
    """The O_DIRECT buffer a load holds besides its window is charged to the memory limit."""
    from shufflefs.serve.parquet_views import work_of
    from shufflefs.windows.view import window_work

    path, index, _ = source
    plan = make_plan(index, ShuffleSpec(strategy="stratified", block_size=65536, buffer=256 * 1024), epoch=0)
    for mode, extra in (("keep", 0), ("direct", int(plan.window_sizes[1]))):
        v = view.View(path, index, plan, source_cache=SourceCache(mode, Room(GiB, "MemTotal")))
        try:
            assert work_of(None, v, plan, 1) == window_work(plan, 1) + extra
        finally:
            v.close()


def test_direct_buffers_are_shared_and_at_most_keep_are_kept(source, monkeypatch):
    from shufflefs.sources import direct

    monkeypatch.setattr(direct, "_free", [])
    path, index, data = source
    plan = make_plan(index, ShuffleSpec(strategy="corgipile", block_size=65536, buffer=256 * 1024), epoch=0)
    monkeypatch.setattr(view, "CACHED", 2.0)
    views = [view.View(path, index, plan, source_cache=SourceCache("direct", Room(GiB, "MemTotal")))
             for _ in range(4)]
    try:
        for v in views:
            for k in range(plan.n_windows):
                v.load_window(k)
        assert 1 <= len(direct._free) <= direct.KEEP
    finally:
        for v in views:
            v.close()


def test_a_filesystem_without_o_direct_falls_back_to_buffered_reads(source, monkeypatch):
    from shufflefs.sources import direct

    def refuse(fd):
        raise direct.Unsupported(22, "O_DIRECT: Invalid argument")

    monkeypatch.setattr(direct, "open_direct", refuse)
    monkeypatch.setattr(view, "CACHED", 2.0)
    path, index, data = source
    plan = make_plan(index, ShuffleSpec(strategy="stratified", block_size=65536, buffer=256 * 1024), epoch=3)
    cache = SourceCache("direct", Room(GiB, "MemTotal"))
    v = view.View(path, index, plan, source_cache=cache)
    keep = view.View(path, index, plan)
    try:
        for k in range(plan.n_windows):
            assert v.load_window(k)[0].tobytes() == keep.load_window(k)[0].tobytes()
        assert not v.direct and v.drop_behind
        assert cache.describe()["window_loads"] == {"buffered": plan.n_windows}
    finally:
        v.close()
        keep.close()
