"""Level: pure (no mount, no daemon).

Windows copied from a mapping of the source: a file that shrinks under the mapping is a stale
source on the thread that loads (never a dead daemon, never padded bytes), the guard leaves
other SIGBUS faults alone, and a mapping still in use outlives its source's close."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from shufflefs.windows import view
from shufflefs.errors import StaleSourceError
from shufflefs.index.table import RecordIndex, SourceStamp
from shufflefs.sources.local import SourceFile
from shufflefs.strategies import ShuffleSpec, make_plan
from test_layout import FixedOrderPlan

pytestmark = pytest.mark.skipif(view._build_window is None, reason="compiled window build not built")

RECORDS, SIZE = 20_000, 100


def order_plan(index: RecordIndex, windows: int) -> FixedOrderPlan:
    """A random record order cut into equal windows (record-level, like ``full``)."""
    order = np.random.default_rng(1).permutation(index.n)
    return FixedOrderPlan(index, order, [index.n * w // windows for w in range(1, windows)])


@pytest.fixture
def source(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, RECORDS * SIZE, dtype=np.uint8)
    path = tmp_path / "records.bin"
    path.write_bytes(data.tobytes())
    bounds = np.arange(0, RECORDS * SIZE + 1, SIZE, dtype=np.int64)
    index = RecordIndex(len(data), bounds, False, SourceStamp.of(os.stat(path)))
    return str(path), index, data


def _expected(data: np.ndarray, index: RecordIndex, ids: np.ndarray) -> bytes:
    b = index.bounds
    return b"".join(data[b[i]: b[i + 1]].tobytes() for i in ids.tolist())


def test_record_windows_come_from_the_mapping_and_match_preads(source, monkeypatch):
    path, index, data = source
    plan = order_plan(index, 8)
    v = view.View(path, index, plan)
    try:
        for k in range(plan.n_windows):
            window, _ = v.load_window(k)
            assert window.tobytes() == _expected(data, index, plan.window(k))
        assert v.source._map is not None  # short runs: copied from the mapping
        monkeypatch.setattr(view, "MAP_RUN", 0)
        fresh = view.View(path, index, plan)
        try:
            window, _ = fresh.load_window(3)
            assert fresh.source._map is None  # pread only
            assert window.tobytes() == _expected(data, index, plan.window(3))
        finally:
            fresh.close()
    finally:
        v.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_a_file_that_shrinks_under_the_mapping_is_stale_on_every_loading_thread(source, threads):
    """The mapping exists (a window was loaded), then the file is cut to a fifth: pages past the
    new end raise SIGBUS inside the copy, which the guard turns into StaleSourceError on each
    thread, again and again; the process lives on."""
    path, index, data = source
    plan = order_plan(index, 4)
    v = view.View(path, index, plan)
    try:
        v.load_window(0)
        assert v.source._map is not None
        os.truncate(path, len(data) // 5)
        errors: list[BaseException] = []

        def load() -> None:
            for k in range(plan.n_windows):
                try:
                    v.source.check = lambda: None  # skip the path check: reach the copy itself
                    v.load_window(k)
                except BaseException as e:  # noqa: BLE001 - collected for the assertion
                    errors.append(e)

        workers = [threading.Thread(target=load) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert len(errors) == threads * plan.n_windows
        assert all(isinstance(e, StaleSourceError) for e in errors), errors
        assert any("size" in str(e) for e in errors)
    finally:
        v.close()


def test_a_sigbus_outside_a_guarded_copy_still_ends_the_process(tmp_path):
    """The handler installed by the compiled module only catches its own copies: touching a
    truncated mapping elsewhere dies of SIGBUS as it would without shufflefs."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 65536)
    code = (
        "import mmap, os, sys\n"
        "import shufflefs._gather\n"
        f"fd = os.open({str(path)!r}, os.O_RDONLY)\n"
        "m = mmap.mmap(fd, 65536, prot=mmap.PROT_READ)\n"
        f"os.truncate({str(path)!r}, 0)\n"
        "print(m[40000])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -7, (done.returncode, done.stderr[-500:])  # SIGBUS


def test_a_mapping_in_use_outlives_the_close_of_its_source(source):
    path, index, data = source
    f = SourceFile(path, index.stamp)
    mapping = f.mapping()
    held = memoryview(mapping)  # as a window load holds it while it copies
    f.close()  # must not raise BufferError or unmap under the copy
    assert bytes(held[:SIZE]) == data[:SIZE].tobytes()
    held.release()
    assert f.mapping() is None  # closed: no new mapping


def test_views_of_one_version_share_its_mapping_and_a_new_version_gets_its_own(source):
    """Views of several epochs open the file each: one mapping serves them all (its pages fault
    in once and count once in the daemon's resident size), until the last of them closes."""
    path, index, data = source
    first, second = SourceFile(path, index.stamp), SourceFile(path, index.stamp)
    shared = first.mapping()
    assert second.mapping() is shared
    first.close()
    assert second.mapping() is shared  # still held by the second
    second.close()
    third = SourceFile(path, index.stamp)
    mapped = third.mapping()
    assert mapped is not shared  # the last user closed: a new one is made
    new = data[::-1].copy()
    with open(path, "r+b") as f:  # a new version in place: same inode and size, new ctime
        f.write(new.tobytes())
    stamp = SourceStamp.of(os.stat(path))
    assert stamp != index.stamp
    fresh = SourceFile(path, stamp)
    assert fresh.mapping() is not mapped  # another version is never served from the old one's
    assert bytes(memoryview(fresh.mapping())[:SIZE]) == new[:SIZE].tobytes()
    third.close()
    fresh.close()


def test_an_empty_or_already_shorter_file_has_no_mapping(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    f = SourceFile(str(empty), SourceStamp.of(os.stat(empty)))
    assert f.mapping() is None
    f.close()
    short = tmp_path / "short"
    short.write_bytes(b"y" * 1000)
    f = SourceFile(str(short), SourceStamp.of(os.stat(short)))
    os.truncate(short, 10)
    with pytest.raises(StaleSourceError):
        f.mapping()
    f.close()


def test_a_pool_member_that_shrinks_is_named(tmp_path):
    """Records copied in view order from a pool's members: the member cut short is the one the
    stale-source error names, and its offset."""
    from shufflefs.index.joined_index import PooledIndex
    from shufflefs.sources.pool import PoolSource

    paths, members = [], []
    for m in range(3):
        path = tmp_path / f"part-{m}.bin"
        path.write_bytes(bytes([m]) * (RECORDS // 3) * SIZE)
        bounds = np.arange(0, (RECORDS // 3) * SIZE + 1, SIZE, dtype=np.int64)
        members.append(RecordIndex((RECORDS // 3) * SIZE, bounds, False, SourceStamp.of(os.stat(path))))
        paths.append(str(path))
    pool = PooledIndex(members)
    source = PoolSource(paths, pool, SourceFile)
    plan = order_plan(pool, 2)
    v = view.View(paths[0], pool, plan, source, frame=(b"", b""))
    try:
        window, _ = v.load_window(0)
        b = pool.bounds
        assert window.tobytes() == b"".join(bytes([int(np.searchsorted(pool.member_firsts, i, "right")) - 1]) * SIZE
                                            for i in plan.window(0).tolist())
        os.truncate(paths[1], 10 * SIZE)
        v.source.check = lambda: None  # reach the copy itself
        with pytest.raises(StaleSourceError, match="part-1"):
            v.load_window(1)
        assert b[-1] == 3 * (RECORDS // 3) * SIZE
    finally:
        v.close()


def test_the_compiled_copies_refuse_what_lies_outside(source):
    """Direct calls: ids or records outside the bounds, the mapping or the output raise before
    touching memory outside them; a truncated mapping reports where."""
    from shufflefs import _gather

    path, index, data = source
    f = SourceFile(path, index.stamp)
    try:
        m = f.mapping()
        i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
        zero, nl = i64(0), np.zeros(0, np.int64)
        out = np.zeros(10 * SIZE, np.uint8)
        assert _gather.gather_mapped(out, (m,), index.bounds, i64(5, 2), zero, zero, zero, nl) == 2 * SIZE
        assert out[:2 * SIZE].tobytes() == data[5 * SIZE: 6 * SIZE].tobytes() + data[2 * SIZE: 3 * SIZE].tobytes()
        for bad in (i64(RECORDS), i64(-1)):
            with pytest.raises(IndexError):
                _gather.gather_mapped(out, (m,), index.bounds, bad, zero, zero, zero, nl)
        with pytest.raises(IndexError):  # the output is too small
            _gather.gather_mapped(out[:SIZE - 1], (m,), index.bounds, i64(1), zero, zero, zero, nl)
        with pytest.raises(IndexError):  # a shift past the mapping
            _gather.gather_mapped(out, (m,), index.bounds, i64(RECORDS - 1), zero, zero, i64(SIZE), nl)
        with pytest.raises(IndexError):  # a member without a mapping
            _gather.gather_mapped(out, (m,), index.bounds, i64(1), zero, i64(-1), zero, nl)
        os.truncate(path, 3 * SIZE)
        got = _gather.gather_mapped(out, (m,), index.bounds, i64(1, RECORDS - 1), zero, zero, zero, nl)
        assert got == (1, (RECORDS - 1) * SIZE)
    finally:
        f.close()


def test_a_cold_source_is_read_by_preads_and_a_cached_one_from_its_mapping(source, monkeypatch):
    """Faults on a mapping read a page at a time and its pages are slow to reclaim: windows of a
    source mostly outside the page cache are read by preads (`view.CACHED`)."""
    path, index, data = source
    calls = []
    real = view._gather_mapped
    monkeypatch.setattr(view, "_gather_mapped", lambda *a: calls.append(1) or real(*a))
    plan = order_plan(index, 4)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages leave the cache
        v = view.View(path, index, plan)
        try:
            window, _ = v.load_window(0)
            assert window.tobytes() == _expected(data, index, plan.window(0))
            assert not calls, "a cold source was copied from its mapping"
            os.pread(fd, len(data), 0)  # now cached
            window, _ = v.load_window(1)
            assert window.tobytes() == _expected(data, index, plan.window(1))
            assert calls
        finally:
            v.close()
    finally:
        os.close(fd)


def test_a_mapping_holds_no_second_descriptor(source):
    """A pool of thousands of members maps each: a mapping that kept a duplicate descriptor
    (as Python's mmap does) would double the daemon's open files."""
    path, index, data = source
    before = len(os.listdir("/proc/self/fd"))
    files = [SourceFile(path, index.stamp) for _ in range(20)]
    try:
        maps = [f.mapping() for f in files]
        assert all(len(m) == len(data) for m in maps)
        assert len(os.listdir("/proc/self/fd")) == before + 20  # the files' own descriptors only
        assert not np.frombuffer(maps[0], np.uint8).flags.writeable
    finally:
        for f in files:
            f.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_cold_page_order_has_every_run_hinted_and_a_cached_one_only_its_long_runs(source, monkeypatch):
    """Cold page orders read a page per run: hinting every run of the window (and the next) puts
    them all in flight at once (`view.HINT_RUN`); warm, the hints would only cost time."""
    path, index, data = source
    plan = make_plan(index, ShuffleSpec(strategy="lirs-page", seed=0, buffer=0.2), 0)
    assert plan.n_windows >= 2
    v = view.View(path, index, plan)
    try:
        hinted = []
        real = v.source.advise
        monkeypatch.setattr(v.source, "advise", lambda idx, first, count: hinted.append(len(first)) or real(idx, first, count))
        monkeypatch.setattr(view, "_cached", lambda members: False)
        window, _ = v.load_window(0, ahead=True)
        assert window.tobytes() == _expected(data, index, plan.window(0))
        assert hinted == [len(plan.window_runs(0)[0]), len(plan.window_runs(1)[0])]
        hinted.clear()
        monkeypatch.setattr(view, "_cached", lambda members: True)
        window, _ = v.load_window(1, ahead=True)
        assert window.tobytes() == _expected(data, index, plan.window(1))
        assert hinted == []  # page runs are far below HINT_RUN
    finally:
        v.close()
