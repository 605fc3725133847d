"""Level: pure (no mount, no daemon).

Layout and assembly, checked against a plain-Python rendering of the same order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import os
import tempfile

from shufflefs.sources import base as source_base
from shufflefs.windows import layout
from shufflefs.windows import view
from shufflefs.errors import StaleSourceError
from shufflefs.index.table import RecordIndex, SourceStamp
from shufflefs.windows.layout import HEADER, TRAILER, Layout, assemble, id_runs, render, slice_fetch, source_runs
from shufflefs.strategies.base import Plan, ShuffleSpec


class FixedOrderPlan(Plan):
    """A plan with a given order cut into given windows (test double for the strategies)."""

    name = "test"

    def __init__(self, index: RecordIndex, order: np.ndarray, cuts: list[int]) -> None:
        super().__init__(index, ShuffleSpec(), 0, 0, 1)
        self.parts = np.split(order.astype(np.int64), cuts)
        self._sizes = np.array([index.out_lengths(p).sum() for p in self.parts], dtype=np.int64)

    @property
    def window_sizes(self) -> np.ndarray:
        return self._sizes

    def window(self, k: int) -> np.ndarray:
        return self.parts[k]


@st.composite
def indexed_files(draw):
    header = draw(st.binary(max_size=20))
    lengths = draw(st.lists(st.integers(1, 50), max_size=40))
    trailer = draw(st.binary(max_size=10))
    add_newline = bool(lengths) and not trailer and draw(st.booleans())
    rnd = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    body = rnd.integers(0, 256, sum(lengths), dtype=np.uint8).tobytes()
    data = header + body + trailer
    bounds = len(header) + np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    index = RecordIndex(len(data), bounds, add_newline)
    order = rnd.permutation(len(lengths))
    ncuts = draw(st.integers(0, max(0, len(lengths))))
    cuts = sorted(rnd.integers(0, len(lengths) + 1, ncuts).tolist())
    return data, index, order, cuts


def naive_view(data: bytes, index: RecordIndex, order: np.ndarray) -> bytes:
    recs = [data[index.bounds[i]: index.bounds[i + 1]] for i in range(index.n)]  # no newline added
    return data[: index.header_end] + b"".join(recs[i] for i in order) + data[index.trailer_start:]


@settings(max_examples=200, deadline=None)
@given(indexed_files())
def test_render_matches_naive_order(case):
    data, index, order, cuts = case
    plan = FixedOrderPlan(index, order, cuts)
    view = render(index, plan, data)
    assert view == naive_view(data, index, order)
    assert len(view) == index.view_size == Layout(index, plan).size


@settings(max_examples=200, deadline=None)
@given(indexed_files(), st.data())
def test_pieces_reassemble_any_range(case, data_st):
    data, index, order, cuts = case
    plan = FixedOrderPlan(index, order, cuts)
    layout = Layout(index, plan)
    view = naive_view(data, index, order)
    fetch = slice_fetch(np.frombuffer(data, np.uint8))
    windows = [assemble(index, plan.window(k), fetch).tobytes() for k in range(plan.n_windows)]
    off = data_st.draw(st.integers(0, len(view) + 5))
    size = data_st.draw(st.integers(0, len(view) + 5))
    got = b""
    for p in layout.pieces(off, size):
        if p.part == HEADER:
            got += data[p.lo: p.hi]
        elif p.part == TRAILER:
            got += data[index.trailer_start + p.lo: index.trailer_start + p.hi]
        else:
            assert 0 <= p.lo < p.hi <= layout.window_size(p.part)
            got += windows[p.part][p.lo: p.hi]
    assert got == view[off: off + size]


def test_fixed_size_records_take_the_row_path_and_stay_exact():
    L, n = 24, 1000
    rnd = np.random.default_rng(1)
    data = rnd.integers(0, 256, 16 + n * L, dtype=np.uint8).tobytes()
    index = RecordIndex(len(data), (16 + L * np.arange(n + 1)).astype(np.int64))
    order = rnd.permutation(n)
    plan = FixedOrderPlan(index, order, [300, 301, 700])
    assert render(index, plan, data) == naive_view(data, index, order)


def test_source_runs_merge_consecutive_records():
    index = RecordIndex(100, np.arange(0, 101, 10, dtype=np.int64))
    starts, ends = source_runs(index, np.array([7, 2, 3, 9, 4]))
    assert starts.tolist() == [20, 70, 90]
    assert ends.tolist() == [50, 80, 100]


def test_large_variable_records_cross_gather_chunks():
    rnd = np.random.default_rng(2)
    lengths = rnd.integers(1, 3 << 20, 12)  # several MiB each: more than one gather chunk
    data = rnd.integers(0, 256, int(lengths.sum()), dtype=np.uint8).tobytes()
    index = RecordIndex(len(data), np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))
    order = rnd.permutation(len(lengths))
    plan = FixedOrderPlan(index, order, [5])
    assert render(index, plan, data) == naive_view(data, index, order)


@pytest.mark.parametrize("compiled", [True, False])
def test_gather_paths_agree_with_slicing(compiled):
    if compiled and source_base._gather is None:
        pytest.skip("compiled gather not built")
    rnd = np.random.default_rng(4)
    lengths = rnd.integers(1, 300, 2000).astype(np.int64)
    src = rnd.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
    src_pos = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    order = rnd.permutation(len(lengths))
    ln, sp = lengths[order], src_pos[order]
    op = np.concatenate(([0], np.cumsum(ln)[:-1]))
    out = np.zeros(len(src), np.uint8)
    source_base.gather(src, sp, ln, out, op, compiled=compiled)
    assert out.tobytes() == b"".join(src[s: s + n].tobytes() for s, n in zip(sp, ln))


def test_compiled_gather_checks_bounds_before_copying():
    if source_base._gather is None:
        pytest.skip("compiled gather not built")
    src = np.arange(10, dtype=np.uint8)
    out = np.zeros(10, np.uint8)
    with pytest.raises(IndexError):
        source_base._gather.gather(out, src, np.array([0, 8], np.int64), np.array([0, 5], np.int64), np.array([2, 5], np.int64))
    assert not out.any()


def test_id_runs_merge_consecutive_ids():
    first, count = id_runs(np.array([7, 2, 3, 9, 4, 10], np.int64))
    assert first.tolist() == [2, 7, 9] and count.tolist() == [3, 1, 2]
    first, count = id_runs(np.empty(0, np.int64))
    assert len(first) == len(count) == 0


# --------------------------------------------------------------------------- windows read from a file


def _stamped(data: bytes, index: RecordIndex) -> tuple[str, RecordIndex]:
    fd, path = tempfile.mkstemp(prefix="shufflefs-layout-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    stamp = SourceStamp.of(os.stat(path))
    return path, RecordIndex(index.size, index.bounds, index.add_newline, stamp)


@pytest.mark.parametrize("compiled,passes,mapped", [(True, 1, False), (True, 3, False), (True, 1, True),
                                                    (False, 1, False)])
@settings(max_examples=150, deadline=None)
@given(case=indexed_files(), scratch=st.integers(1, 120))
def test_view_windows_match_the_reference(compiled, passes, mapped, case, scratch):
    """`View.load_window` (the compiled chunked read, its copy from a mapping, or the numpy
    fallback) builds the same bytes as `assemble`, for scratch buffers smaller than records and
    windows; ``passes`` 3: a record-level window is built a few records at a time (as sparse
    windows are)."""
    if compiled and view._build_window is None:
        pytest.skip("compiled window build not built")
    data, index, order, cuts = case
    path, index = _stamped(data, index)
    saved = view._build_window, view.RECORD_CHUNK, view.SPARSE, view.MAP_RUN
    try:
        view.MAP_RUN = 1 << 62 if mapped else 0
        if not compiled:
            view._build_window = None
        if passes > 1:
            view.RECORD_CHUNK, view.SPARSE = passes, 2.0
        plan = FixedOrderPlan(index, order, cuts)
        v = view.View(path, index, plan)
        try:
            fetch = slice_fetch(np.frombuffer(data, np.uint8))
            out = np.full(max([len(data) + 8] + [int(x) for x in plan.window_sizes]), 0xEE, np.uint8)
            buf = np.zeros(scratch, np.uint8)
            for k in range(plan.n_windows):
                win, used = v.load_window(k, out, buf)
                assert win.tobytes() == assemble(index, plan.window(k), fetch).tobytes()
                assert len(win) == Layout(index, plan).window_size(k)
        finally:
            v.close()
    finally:
        view._build_window, view.RECORD_CHUNK, view.SPARSE, view.MAP_RUN = saved
        os.unlink(path)


def test_compiled_window_build_checks_everything_before_reading():
    if view._build_window is None:
        pytest.skip("compiled window build not built")
    data = bytes(range(100))
    bounds = np.arange(0, 101, 10, dtype=np.int64)  # ten records of ten bytes
    fd, path = tempfile.mkstemp(prefix="shufflefs-layout-")
    os.write(fd, data)
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731

    def build(out, scratch, bounds, ids, first, count, newline=(), fds=None, shifts=None):
        runs = len(first)
        fds = np.full(runs, fd, np.int64) if fds is None else fds
        shifts = np.zeros(runs, np.int64) if shifts is None else shifts
        return view._build_window(out, scratch, bounds, ids, first, count, fds, shifts, np.array(newline, np.int64))

    try:
        out = np.zeros(100, np.uint8)
        scratch = np.zeros(16, np.uint8)
        bad = [
            (i64(1, 1), i64(1), i64(2)),  # an id twice (and one missing)
            (i64(1, 5), i64(1), i64(2)),  # an id outside the runs
            (i64(3, 1), i64(3, 1), i64(1, 1)),  # runs out of order
            (i64(9, 10), i64(9), i64(2)),  # a run past the last record
            (i64(1, 2), i64(1), i64(3)),  # runs hold more records than the ids
        ]
        for ids, first, count in bad:
            with pytest.raises((IndexError, ValueError)):
                build(out, scratch, bounds, ids, first, count)
        with pytest.raises(IndexError):  # the window does not fit the output
            build(np.zeros(15, np.uint8), scratch, bounds, i64(2, 1), i64(1), i64(2))
        with pytest.raises(IndexError):  # a shift before the start of the file
            build(out, scratch, bounds, i64(2, 1), i64(1), i64(2), shifts=i64(-11))
        with pytest.raises(ValueError):  # newline ids out of order
            build(out, scratch, bounds, i64(2, 1), i64(1), i64(2), newline=(2, 1))
        assert not out.any()
        # a record larger than the scratch goes straight to its place; an added newline follows the last record
        assert build(out, scratch, np.array([0, 40, 100], np.int64), i64(1, 0), i64(0), i64(2)) == 100
        assert bytes(out[:60]) == data[40:] and bytes(out[60:100]) == data[:40]
        assert build(out, scratch, np.array([0, 40, 99], np.int64), i64(1, 0), i64(0), i64(2), newline=(1,)) == 100
        assert bytes(out[:60]) == data[40:99] + b"\n" and bytes(out[60:100]) == data[:40]
        # a file shorter than its index: the run and the offset where it ended
        assert build(np.zeros(120, np.uint8), scratch, np.array([0, 60, 120], np.int64), i64(1, 0), i64(0), i64(2)) == (0, 100)
        # two files: runs with their own descriptor and shift, a newline after each file's last record
        other = tempfile.TemporaryFile()
        other.write(b"HEADER" + b"abcdefgh")
        other.flush()
        pooled = np.array([0, 10, 20, 24, 28], np.int64)  # data[0:20] then the other file's 8 bytes at 6
        fds, shifts = i64(fd, other.fileno()), i64(0, 6 - 20)
        got = build(out, scratch, pooled, i64(2, 0, 3, 1), i64(0, 2), i64(2, 2), newline=(1, 3), fds=fds, shifts=shifts)
        assert got == 30
        assert bytes(out[:30]) == b"abcd" + data[0:10] + b"efgh\n" + data[10:20] + b"\n"
        other.close()
    finally:
        os.close(fd)
        os.unlink(path)


def test_a_source_shorter_than_its_index_is_stale_not_padded():
    data = b"".join(b"%04d\n" % i for i in range(100))
    bounds = np.arange(0, 501, 5, dtype=np.int64)
    path, index = _stamped(data, RecordIndex(500, bounds))
    try:
        plan = FixedOrderPlan(index, np.arange(100)[::-1].copy(), [50])
        v = view.View(path, index, plan)
        with open(path, "r+b") as f:
            f.truncate(300)
        with pytest.raises(StaleSourceError):
            v.load_window(0)
        v.close()
    finally:
        os.unlink(path)
