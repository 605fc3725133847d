"""Level: pure (files on disk, no mount).

A mixture's epoch as one offset table (`MixIndex`): each source's records are exactly the ones
`epoch_records` takes, in stream order; its pieces interleave so every stretch holds each
source's share; every record of the epoch has its file's bytes (repeats included; a line without
its newline given at the end of the epoch, with one added between such lines), read alike through descriptors, mappings and plain range reads; units never
cross segments nor their file's block grid; and the table is a pure function of its inputs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.formats import make_format
from shufflefs.index.table import SourceStamp
from shufflefs.index.joined_index import PooledIndex
from shufflefs.pools.mix_index import MixIndex, epoch_index
from shufflefs.sources.local import SourceFile
from shufflefs.sources.pool import PoolSource
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.mixture import epoch_records, epoch_segments, in_file_order
from shufflefs.windows import view


@given(st.integers(0, 2**31), st.integers(0, 30),
       st.lists(st.tuples(st.integers(1, 400), st.integers(0, 900), st.integers(1, 50)), min_size=1, max_size=4))
@settings(max_examples=80)
def test_each_sources_pieces_are_its_epoch_records_each_pass_in_file_order(seed, epoch, table):
    counts, takes, runs = zip(*table)
    src, first, count = epoch_segments(seed, epoch, counts, takes, runs)
    for s in range(len(counts)):
        mine = src == s
        ids = np.concatenate([np.arange(f, f + c) for f, c in zip(first[mine], count[mine])] or [np.zeros(0, int)])
        want = epoch_records(seed, epoch, s, counts[s], takes[s], runs[s])
        assert np.array_equal(ids, in_file_order(want, epoch * takes[s], counts[s]))
        # each pass's records in file order: sorted between the pass boundaries
        at = epoch * takes[s] + np.arange(len(ids))
        for p in np.unique(at // counts[s]):
            assert np.all(np.diff(ids[at // counts[s] == p]) > 0)
    assert np.all(count > 0)


@pytest.mark.parametrize("takes", [(3000, 1000), (500, 1500, 2000), (9000, 30, 970)])
def test_every_stretch_of_single_records_holds_each_sources_share(takes):
    src, first, count = epoch_segments(7, 2, [5000] * len(takes), takes, [1] * len(takes))
    per_record = np.repeat(src, count)
    share = np.asarray(takes) / sum(takes)
    for lo in range(0, len(per_record) - 1000, 250):
        got = np.bincount(per_record[lo: lo + 1000], minlength=len(takes)) / 1000
        assert np.all(np.abs(got - share) <= len(takes) / 1000 + 1e-9), (lo, got, share)


def _files(tmp_path, sizes):
    """JSON-ish lines of varying length naming their file and line; the last file's last line
    lacks its newline."""
    paths, members, records = [], [], []
    fmt = make_format("lines")
    for f, n in enumerate(sizes):
        lines = [f"f{f}-{i}-" + "x" * ((i * 7 + f) % 23) for i in range(n)]
        data = "\n".join(lines) + ("" if f == len(sizes) - 1 else "\n")
        path = tmp_path / f"part-{f}.txt"
        path.write_text(data)
        idx = fmt.scan(np.frombuffer(path.read_bytes(), np.uint8), str(path))
        members.append(type(idx)(idx.size, idx.bounds, idx.add_newline, SourceStamp.of(os.stat(path))))
        paths.append(str(path))
        records.extend((line + "\n").encode() for line in lines)
    records[-1] = records[-1][:-1]  # torn: no newline
    return paths, PooledIndex(members), records


def _bytes(records, mix, order) -> bytes:
    """The records of the epoch at positions ``order``, the torn ones given a newline where the
    view adds one (between torn records at the end of the epoch)."""
    ids, nl = mix.base_ids(), set(mix.newline_ids.tolist())
    return b"".join(records[ids[j]] + (b"\n" if j in nl else b"") for j in order)


def _bytes_each(records, mix) -> list[bytes]:
    return [_bytes(records, mix, [j]) for j in range(mix.n)]


def _served(paths, mix, plan) -> bytes:
    """Every window of ``plan`` as a view over the files loads it."""
    v = view.View(paths[0], mix, plan, PoolSource(paths, mix, SourceFile), frame=(b"", b""))
    try:
        return b"".join(v.load_window(k)[0].tobytes() for k in range(plan.n_windows))
    finally:
        v.close()


def _order(plan) -> np.ndarray:
    return np.concatenate([plan.window(k) for k in range(plan.n_windows)])


@pytest.mark.parametrize("strategy,samples", [("corgipile", None), ("full", 700), ("block", 5000), ("none", 40)])
@pytest.mark.parametrize("path", ["runs", "mapped", "reads"])
def test_every_record_of_the_epoch_has_its_files_bytes(tmp_path, monkeypatch, strategy, samples, path):
    paths, base, records = _files(tmp_path, [300, 50, 700, 120])
    spec = ShuffleSpec(strategy=strategy, seed=5, block_size=512, buffer=2048)
    mix = epoch_index(base, [0, 2, 4], [2, 1], samples, spec, epoch=3)
    assert mix.n == (samples or 1170) and sum(mix.takes) == mix.n
    ids = mix.base_ids()
    torn = np.flatnonzero(ids == len(records) - 1)  # the last file's last line: taken last
    assert mix.torn == len(torn) and np.array_equal(torn, np.arange(mix.n - mix.torn, mix.n))
    assert np.array_equal(mix.newline_ids, torn[:-1])
    assert np.array_equal(mix.out_lengths(np.arange(mix.n)), [len(x) for x in _bytes_each(records, mix)])
    if path != "mapped":
        monkeypatch.setattr(view, "_gather_mapped", None)
    if path == "reads":
        monkeypatch.setattr(view, "_build_window", None)
    plan = make_plan(mix, spec, 3)
    assert _served(paths, mix, plan) == _bytes(records, mix, _order(plan))


def test_an_upsampled_source_repeats_whole_passes_and_its_repeats_read_alike(tmp_path):
    paths, base, records = _files(tmp_path, [40, 30])
    spec = ShuffleSpec(strategy="full", seed=1)
    mix = epoch_index(base, [0, 1, 2], [3, 1], 400, spec, epoch=0)
    ids = mix.base_ids()
    assert np.array_equal(np.bincount(ids, minlength=70)[:40], np.full(40, 7) + (np.bincount(ids)[:40] > 7))
    assert np.bincount(ids, minlength=70)[:40].min() == 7  # 300 of 40 records: 7 passes and a slice
    plan = make_plan(mix, spec, 0)
    assert _served(paths, mix, plan) == _bytes(records, mix, _order(plan))


@given(st.integers(0, 10**6), st.sampled_from([64, 256, 1000, 4096]))
@settings(max_examples=25, deadline=None)
def test_units_stay_inside_one_segment_and_one_grid_cell_of_its_file(tmp_path_factory, epoch, unit):
    paths, base, _ = _files(tmp_path_factory.mktemp("u"), [200, 90, 310])
    spec = ShuffleSpec(strategy="corgipile", seed=2, block_size=512)
    mix = epoch_index(base, [0, 1, 3], [1, 2], 600, spec, epoch)
    firsts = mix.unit_firsts(unit)
    assert firsts[0] == 0 and firsts[-1] == mix.n and np.all(np.diff(firsts) > 0)
    seg = np.searchsorted(mix.member_firsts, np.arange(mix.n), "right") - 1
    cell = (mix.bounds[:-1] + mix.shifts[seg]) // unit
    for a, b in zip(firsts[:-1], firsts[1:]):
        assert len(set(seg[a:b])) == 1 and len(set(cell[a:b])) == 1
    assert np.all(np.isin(mix.member_firsts[:-1], firsts))  # every segment starts a unit


def test_the_table_is_a_pure_function_of_its_inputs_and_epochs_differ(tmp_path):
    _, base, _ = _files(tmp_path, [500, 500])
    spec = ShuffleSpec(strategy="corgipile", seed=9, block_size=512)
    a, b = (epoch_index(base, [0, 1, 2], [1, 1], 300, spec, 4) for _ in range(2))
    assert np.array_equal(a.base_ids(), b.base_ids()) and np.array_equal(a.bounds, b.bounds)
    c = epoch_index(base, [0, 1, 2], [1, 1], 300, spec, 5)
    assert not np.array_equal(a.base_ids(), c.base_ids())
    assert isinstance(a, MixIndex) and a.takes == (150, 150)


def test_a_source_without_records_asked_for_some_is_refused(tmp_path):
    paths, base, _ = _files(tmp_path, [10, 0])
    with pytest.raises(ValueError, match="source #2 has no records"):
        epoch_index(base, [0, 1, 2], [1, 1], 10, ShuffleSpec(strategy="full"), 0)


@pytest.mark.parametrize("strategy", ["stratified", "corgipile", "full", "none", "block"])
@pytest.mark.parametrize("world", [1, 2])
def test_no_record_is_served_next_to_its_own_copy(tmp_path, strategy, world):
    """An up-sampled source (300 records drawn from 70, in blocks of about 8) and a down-sampled
    one whose slice crosses a pass: every copy apart, in every window and across windows, while
    every window keeps exactly its records (the torn line the epoch takes aside: given last)."""
    from shufflefs.strategies.mixture import SpreadRepeats
    from shufflefs.strategies.torn import TornLast

    _, base, _ = _files(tmp_path, [40, 30, 500])
    spec = ShuffleSpec(strategy=strategy, seed=4, block_size=512, buffer=4096)
    mix = epoch_index(base, [0, 2, 3], [3, 2], 750, spec, epoch=1)
    assert mix.repeated is not None and mix.repeated.sum() > 200
    for rank in range(world):
        plan = make_plan(mix, spec, 1, rank, world)
        spread = plan.inner if isinstance(plan, TornLast) else plan
        assert isinstance(spread, SpreadRepeats)
        stream = np.concatenate([plan.window(k) for k in range(plan.n_windows)])
        body = stream[stream < mix.n - mix.torn]
        assert np.array_equal(stream[: len(body)], body)
        key = mix.base_ids_of(body)
        assert not np.any(key[1:] == key[:-1]), np.flatnonzero(key[1:] == key[:-1])
        for k in range(spread.n_windows):
            assert np.array_equal(np.sort(spread.window(k)), np.sort(spread.inner.window(k)))
            assert np.array_equal(spread.window(k), spread.window(k))  # the same every time


def test_a_mixture_walks_only_the_directories_its_globs_can_match():
    from shufflefs.pools.mixes import walk_roots

    assert walk_roots(["web/en/*.jsonl", "web/*.jsonl", "books/**/*.jsonl"]) == ["books", "web"]
    assert walk_roots(["web/*.jsonl", "*.jsonl"]) == [""]  # a bare name matches anywhere
    assert walk_roots(["w*/x.jsonl"]) == [""] and walk_roots(["./x/*.jsonl"]) == [""]
    assert walk_roots(["a/b/c.jsonl"]) == ["a/b"]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 60)), min_size=1, max_size=400), st.integers(0, 2**31))
@settings(max_examples=60)
def test_a_proportional_order_is_a_permutation_keeping_every_stretch_in_proportion(units, seed):
    from shufflefs.strategies.mixture import proportional_order

    group, records = (np.array(x) for x in zip(*units))
    order = proportional_order(group, records, np.random.default_rng(seed))
    assert np.array_equal(np.sort(order), np.arange(len(group)))
    # each group's records spread over the order: at any point a group has given its share of
    # its records, give or take one unit of each group
    total = records.sum()
    given = np.cumsum(records[order])
    for g in np.unique(group):
        mine = np.cumsum(np.where(group[order] == g, records[order], 0))
        share = records[group == g].sum() / total
        slack = records[group == g].max() + records.max() * len(np.unique(group))
        assert np.all(np.abs(mine - share * given) <= slack + 1e-9)


@pytest.mark.parametrize("strategy", ["corgipile", "block", "pls"])
def test_block_orders_keep_a_mixtures_sources_in_proportion(tmp_path, strategy):
    """CorgiPile's blocks are permuted within each source and the sources interleaved: its
    buffers hold each source's share, where a uniform block permutation gives a draw of it."""
    _, base, _ = _files(tmp_path, [3000, 600, 2500])
    spec = ShuffleSpec(strategy=strategy, seed=8, block_size=512, buffer=8192)
    mix = epoch_index(base, [0, 1, 2, 3], [5, 2, 3], 4000, spec, 2)
    plan = make_plan(mix, spec, 2, 0, 2 if strategy == "pls" else 1)
    order = _order(plan)
    source = mix.source_of(order)
    share = np.bincount(source, minlength=3) / len(source)
    windows = [source[plan.window_records[:k].sum(): plan.window_records[:k + 1].sum()] for k in range(plan.n_windows)]
    for w in windows[:-1]:  # every full buffer: each source within a block or two of its share
        assert np.all(np.abs(np.bincount(w, minlength=3) / len(w) - share) < 0.1), (np.bincount(w, minlength=3), share)
