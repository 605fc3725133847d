"""Level: pure (no mount, no daemon).

A pool's index over several files, and the shards' stretches of the pooled stream.  Members whose
last line lacks its newline end in torn records, which the pool's views give last
(`PooledIndex.torn_last`)."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.formats import make_format
from shufflefs.windows import view
from shufflefs.index.table import RecordIndex, SourceStamp, unit_firsts
from shufflefs.windows.layout import assemble
from shufflefs.index.joined_index import PooledIndex, split_runs
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.slices import SlicePlan, slice_edges
from shufflefs.sources.local import SourceFile
from shufflefs.sources.pool import PoolSource

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def line_files(draw) -> list[bytes]:
    """2-5 JSON-lines-like files, some empty, some without their last newline, some with a header."""
    files = []
    for _ in range(draw(st.integers(2, 5))):
        lengths = draw(st.lists(st.integers(1, 40), max_size=30))
        body = b"".join(b"x" * (n - 1) + b"\n" for n in lengths)
        if body and draw(st.booleans()):
            body = body[:-1]  # no newline after the last record
        files.append(body)
    return files


def indexes(files: list[bytes], header_lines: int = 0) -> list[RecordIndex]:
    fmt = make_format("lines", {"header_lines": header_lines})
    return [fmt.scan(np.frombuffer(f, np.uint8), f"f{i}") for i, f in enumerate(files)]


def pooled_fetch(files: list[bytes], members: list[RecordIndex], pool: PooledIndex):
    """Reads pooled ranges from the members' bytes through the pool's shifts (what the daemon does)."""
    def fetch(starts, ends):
        first, count, member = split_runs(pool.bounds[pool.member_firsts], starts, ends - starts)
        file = pool.member_file[member]
        out = [np.frombuffer(files[m][f + sh: f + n + sh], np.uint8)
               for f, n, m, sh in zip(first.tolist(), count.tolist(), file.tolist(), pool.shifts[member].tolist())]
        return np.concatenate(out) if out else np.empty(0, np.uint8)

    return fetch


def records(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def torn_last(files: list[bytes]) -> bytes:
    """The pool in source order as its views give it: every member's lines, its torn last line
    (without a newline) left out, then the torn lines in member order, a newline between them."""
    whole = [f[: f.rfind(b"\n") + 1] for f in files]
    torn = [f[f.rfind(b"\n") + 1:] for f in files if f and not f.endswith(b"\n")]
    return b"".join(whole) + b"\n".join(torn)


@SETTINGS
@given(files=line_files())
def test_the_pool_in_source_order_is_the_members_concatenated(files):
    members = indexes(files)
    base = PooledIndex(members)
    pool = base.torn_last()
    assert pool.n == base.n == sum(m.n for m in members)
    plan = make_plan(pool, ShuffleSpec(strategy="none", buffer=64), 0)
    fetch = pooled_fetch(files, members, pool)
    got = b"".join(assemble(pool, plan.window(k), fetch).tobytes() for k in range(plan.n_windows))
    want = torn_last(files)
    assert got == want
    assert int(plan.window_sizes.sum()) == len(want) == pool.data_bytes
    assert base.unterminated_ids.tolist() == [int(base.member_firsts[i + 1]) - 1 for i, m in enumerate(members)
                                              if m.add_newline]
    torn = len(base.unterminated_ids)
    assert (pool is base) == (torn == 0) and pool.torn == torn
    assert pool.newline_ids.tolist() == list(range(pool.n - torn, pool.n - 1))


@SETTINGS
@given(files=line_files(), unit=st.integers(1, 64))
def test_units_never_cross_files_and_follow_each_files_grid(files, unit):
    members = indexes(files)
    pool = PooledIndex(members)
    firsts = pool.unit_firsts(unit)
    assert firsts[0] == 0 and firsts[-1] == pool.n and np.all(np.diff(firsts) > 0)
    for m, idx in enumerate(members):
        lo, hi = pool.member_firsts[m], pool.member_firsts[m + 1]
        inside = firsts[(firsts >= lo) & (firsts < hi)] - lo
        assert inside.tolist() == unit_firsts(idx.bounds, unit)[:-1].tolist() if idx.n else len(inside) == 0
    assert np.all(np.isin(pool.member_firsts[:-1][np.diff(pool.member_firsts) > 0], firsts))


@SETTINGS
@given(files=line_files(), strategy=st.sampled_from(["corgipile", "full", "lirs-page", "block"]),
       epoch=st.integers(0, 3), seed=st.integers(0, 5))
def test_a_shuffled_pool_holds_every_record_of_every_member_once(files, strategy, epoch, seed):
    members = indexes(files, header_lines=0)
    pool = PooledIndex(members).torn_last()
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=32, buffer=96, page_size=16)
    plan = make_plan(pool, spec, epoch)
    fetch = pooled_fetch(files, members, pool)
    got = b"".join(assemble(pool, plan.window(k), fetch).tobytes() for k in range(plan.n_windows))
    want = torn_last(files)
    assert sorted(records(got)) == sorted(records(want))
    tail = b"\n".join(f[f.rfind(b"\n") + 1:] for f in files if f and not f.endswith(b"\n"))
    assert got.endswith(tail)  # the torn lines last, in member order


@SETTINGS
@given(bounds=st.lists(st.integers(0, 30), min_size=2, max_size=8),
       runs=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), max_size=8))
def test_split_runs_cut_runs_where_members_end(bounds, runs):
    firsts = np.cumsum([0] + bounds).astype(np.int64)
    n = int(firsts[-1])
    ids = sorted({i for a, c in runs for i in range(a, a + c) if i < n})
    arr = np.array(ids, np.int64)
    brk = np.flatnonzero(np.diff(arr) != 1) + 1 if len(arr) else np.zeros(0, np.int64)
    first = arr[np.concatenate(([0], brk))] if len(arr) else arr
    count = np.diff(np.concatenate(([0], brk, [len(arr)]))) if len(arr) else arr
    f, c, m = split_runs(firsts, first, count)
    assert np.concatenate([np.arange(a, a + k) for a, k in zip(f, c)] or [np.zeros(0)]).tolist() == ids
    assert np.all(c > 0)
    assert np.all(firsts[m] <= f) and np.all(f + c <= firsts[m + 1])


@SETTINGS
@given(files=line_files(), strategy=st.sampled_from(["corgipile", "full", "window", "none"]),
       shards=st.integers(1, 6), world=st.integers(1, 3), data=st.data())
def test_shards_split_the_stream_by_position(files, strategy, shards, world, data):
    pool = PooledIndex(indexes(files)).torn_last()
    rank = data.draw(st.integers(0, world - 1))
    spec = ShuffleSpec(strategy=strategy, seed=3, block_size=40, buffer=100)
    inner = make_plan(pool, spec, 1, rank, world)
    stream = np.concatenate([inner.window(k) for k in range(inner.n_windows)] or [np.zeros(0, np.int64)])
    edges = slice_edges(len(stream), shards)
    assert np.all(np.diff(edges) >= 0) and np.diff(edges).max() - np.diff(edges).min() <= 1
    got = []
    for i in range(shards):
        s = SlicePlan(inner, int(edges[i]), int(edges[i + 1]), i, shards)
        ids = [s.window(k) for k in range(s.n_windows)]
        assert [len(x) for x in ids] == s.window_records.tolist()
        assert s.window_sizes.tolist() == [int(pool.out_lengths(x).sum()) for x in ids]
        for k in range(s.n_windows):
            kin, shift = s.stream_window(k)  # the shard's window is a byte range of a stream window
            full = inner.window(kin)
            cum = np.concatenate(([0], np.cumsum(pool.out_lengths(full))))
            pos = int(np.searchsorted(cum, shift))
            assert cum[pos] == shift and full[pos: pos + len(ids[k])].tolist() == ids[k].tolist()
            runs = s.window_runs(k)
            if runs is not None:
                assert sorted(ids[k].tolist()) == np.concatenate(
                    [np.arange(a, a + c) for a, c in zip(*runs)] or [np.zeros(0)]).tolist()
        got.append(np.concatenate(ids) if ids else np.zeros(0, np.int64))
    assert np.concatenate(got).tolist() == stream.tolist()


@SETTINGS
@given(files=line_files(), header=st.integers(0, 1), cuts=st.lists(st.floats(0, 1), max_size=12),
       strategy=st.sampled_from(["corgipile", "full"]))
def test_pool_source_reads_pooled_ranges_from_its_members(files, header, cuts, strategy):
    """`PoolSource.read_runs` (the window build without the compiled module) returns pooled byte
    ranges, also those spanning members, and a pooled view built that way equals the reference."""
    files = [b"h\n" * header + f for f in files]
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, f"part-{i:05d}.jsonl") for i in range(len(files))]
        for p, f in zip(paths, files):
            with open(p, "wb") as out:
                out.write(f)
        members = [dataclasses.replace(m, stamp=SourceStamp.of(os.stat(p)))
                   for m, p in zip(indexes(files, header_lines=header), paths)]
        base = PooledIndex(members)
        pool = base.torn_last()
        data = b"".join(f[m.header_end: m.trailer_start] for f, m in zip(files, members))
        edges = sorted({int(c * len(data)) for c in cuts} | {0, len(data)})
        starts, ends = np.array(edges[:-1][::2], np.int64), np.array(edges[1:][::2], np.int64)
        source = PoolSource(paths, base, SourceFile)
        saved = view._build_window, view.MAP_RUN
        try:
            got = source.read_runs(starts, ends).tobytes()
            source.close()
            source = PoolSource(paths, pool, SourceFile)
            assert got == b"".join(data[s:e] for s, e in zip(starts.tolist(), ends.tolist()))
            plan = make_plan(pool, ShuffleSpec(strategy=strategy, block_size=32, buffer=96), 1)
            fetch = pooled_fetch(files, members, pool)
            view._build_window = None
            v = view.View(paths[0], pool, plan, source.share(), frame=(b"", b""))
            for k in range(plan.n_windows):
                assert v.load_window(k)[0].tobytes() == assemble(pool, plan.window(k), fetch).tobytes()
            v.close()
            view._build_window = saved[0]
            # compiled: preads of runs, then copies in view order from the members' mappings
            for map_run in (0, 1 << 62):
                view.MAP_RUN = map_run
                if view._build_window is None:
                    break
                v = view.View(paths[0], pool, plan, source.share(), frame=(b"", b""))
                for k in range(plan.n_windows):
                    assert v.load_window(k)[0].tobytes() == assemble(pool, plan.window(k), fetch).tobytes()
                v.close()
        finally:
            view._build_window, view.MAP_RUN = saved
            source.close()
