"""Level: pure (no mount, no daemon).

Shuffle strategies: every plan is a deterministic partition of the records into windows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.index.table import RecordIndex
from shufflefs.strategies import STRATEGIES, STRATEGY_HELP, check_spec, make_plan
from shufflefs.strategies.base import ShuffleSpec
from shufflefs.strategies.sliding_window import sliding_window_order
from shufflefs.index.table import unit_firsts
from shufflefs.strategies.units import concat_ranges, cuts_by_bytes, id_dtype, order_cuts

ALL = sorted(STRATEGIES)
SAME_ORDER_ACROSS_WORLDS = ["none", "once", "full", "lirs-page", "block"]
EPOCH_DEPENDENT = ["full", "lirs-page", "block", "corgipile", "window", "pls"]


def make_index(lengths, header=0, trailer=0, add_newline=False) -> RecordIndex:
    bounds = header + np.concatenate(([0], np.cumsum(np.asarray(lengths, dtype=np.int64)))).astype(np.int64)
    return RecordIndex(int(bounds[-1]) + trailer, bounds, add_newline and len(lengths) > 0)


@st.composite
def indexes(draw, max_records=60):
    lengths = draw(st.lists(st.integers(1, 40), max_size=max_records))
    return make_index(lengths, draw(st.integers(0, 20)), draw(st.integers(0, 20)), draw(st.booleans()))


specs = st.builds(
    ShuffleSpec,
    strategy=st.sampled_from(ALL),
    seed=st.integers(0, 2**40),
    block_size=st.integers(1, 64),
    buffer=st.one_of(st.integers(1, 300), st.floats(0.01, 1.0)),
    page_size=st.integers(1, 32),
    exchange=st.floats(0.0, 1.0),
)


def windows(plan) -> list[np.ndarray]:
    return [plan.window(k) for k in range(plan.n_windows)]


def rank_orders(index, spec, epoch, world) -> list[np.ndarray]:
    out = []
    for r in range(world):
        ws = windows(make_plan(index, spec, epoch, r, world))
        out.append(np.concatenate(ws) if ws else np.empty(0, np.int64))
    return out


def owners(index: RecordIndex, unit_size: int) -> np.ndarray:
    """Unit of every record, the slow obvious way."""
    return np.array([int(s) // unit_size for s in index.starts], dtype=np.int64)


def runs(keys: np.ndarray) -> list[int]:
    """The sequence of distinct consecutive keys."""
    return [int(k) for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]


# ----------------------------------------------------------------------- the contract of every plan


@settings(max_examples=60, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(1, 4))
def test_windows_partition_records_exactly(index, spec, epoch, world):
    seen = []
    for r in range(world):
        plan = make_plan(index, spec, epoch, r, world)
        sizes = plan.window_sizes
        assert sizes.dtype == np.int64 and len(sizes) == plan.n_windows
        for k in range(plan.n_windows):
            ids = plan.window(k)
            assert ids.dtype == id_dtype(index.n) and len(ids) > 0
            assert sizes[k] == index.out_lengths(ids).sum()
            seen.append(ids)
        again = make_plan(index, spec, epoch, r, world)
        assert np.array_equal(again.window_sizes, sizes)
        assert all(np.array_equal(a, b) for a, b in zip(windows(again), windows(plan)))
    allids = np.concatenate(seen) if seen else np.empty(0, np.int64)
    assert np.array_equal(np.sort(allids), np.arange(index.n))


@settings(max_examples=60, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(1, 3))
def test_window_runs_are_the_sorted_ids_as_runs(index, spec, epoch, world):
    for r in range(world):
        plan = make_plan(index, spec, epoch, r, world)
        for k in range(plan.n_windows):
            got = plan.window_runs(k)
            if got is None:  # the plan does not know them cheaply; the view sorts the ids
                continue
            first, count = got
            assert first.dtype == count.dtype == np.int64 and np.all(count > 0)
            assert np.all(first[1:] > first[:-1] + count[:-1])  # ascending, adjacent runs merged
            assert np.array_equal(concat_ranges(first, first + count), np.sort(plan.window(k)))


@settings(max_examples=30, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(2, 4))
def test_rank_shares_split_the_single_rank_order(index, spec, epoch, world):
    whole = rank_orders(index, spec, epoch, 1)[0]
    parts = rank_orders(index, spec, epoch, world)
    if spec.strategy in SAME_ORDER_ACROSS_WORLDS:
        assert np.array_equal(np.concatenate(parts), whole)
    elif spec.strategy in ("corgipile", "stratified"):
        # the same block sequence, split into contiguous pieces; shuffled inside each rank's windows
        own = owners(index, spec.block_size)
        assert runs(own[np.sort(np.concatenate(parts))]) == runs(own[np.sort(whole)])
        pieces = [sorted(set(own[p].tolist())) for p in parts]
        # shares are cut at equal record counts: only a block at a cut is split between two ranks,
        # and the block of an unterminated last line, which stays last ([views-torn])
        torn = int(index.add_newline)
        assert len(set(own.tolist())) <= sum(len(p) for p in pieces) <= len(set(own.tolist())) + world - 1 + torn
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("n", [0, 1])
def test_zero_and_one_record(strategy, n):
    index = make_index([5] * n, header=3, trailer=2, add_newline=True)
    for world in (1, 3):
        orders = rank_orders(index, ShuffleSpec(strategy, block_size=2, buffer=1), 0, world)
        assert sorted(np.concatenate(orders).tolist()) == list(range(n))
    plan = make_plan(index, ShuffleSpec(strategy, block_size=2, buffer=1.0), 0)
    assert plan.window_sizes.sum() == index.data_bytes == (5 if n else 0)  # a torn line gains no newline


# ----------------------------------------------------------------------- strategy by strategy


def spread_index() -> RecordIndex:
    """200 records of 10 bytes: 20 blocks of 100 bytes, two per 200-byte window."""
    return make_index([10] * 200)


SPREAD = dict(block_size=100, page_size=100, buffer=200)


@pytest.mark.parametrize("strategy", EPOCH_DEPENDENT)
def test_epochs_and_seeds_change_the_order(strategy):
    index = spread_index()
    order = lambda seed, epoch: rank_orders(index, ShuffleSpec(strategy, seed, **SPREAD), epoch, 1)[0]
    assert not np.array_equal(order(0, 0), order(0, 1))
    assert not np.array_equal(order(0, 0), order(1, 0))
    assert not np.array_equal(order(0, 0), np.arange(index.n))


def test_once_is_fixed_across_epochs_but_not_seeds():
    index = spread_index()
    for world in (1, 3):
        first = rank_orders(index, ShuffleSpec("once", 7, **SPREAD), 0, world)
        for epoch in (1, 5):
            assert all(np.array_equal(a, b) for a, b in zip(first, rank_orders(index, ShuffleSpec("once", 7, **SPREAD), epoch, world)))
    assert not np.array_equal(first[0], rank_orders(index, ShuffleSpec("once", 8, **SPREAD), 0, 3)[0])


@settings(max_examples=40, deadline=None)
@given(index=indexes(), spec=specs, world=st.integers(1, 4))
def test_none_is_source_order_in_contiguous_rank_ranges(index, spec, world):
    spec = ShuffleSpec("none", spec.seed, spec.block_size, spec.buffer)
    orders = rank_orders(index, spec, 2, world)
    assert np.array_equal(np.concatenate(orders), np.arange(index.n))
    sizes = [len(o) for o in orders]  # ranks split at equal record counts
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=40, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(1, 4))
def test_corgipile_windows_hold_exactly_their_blocks(index, spec, epoch, world):
    index = index.body()  # a torn last line is planned apart (`torn.TornLast`)
    own = owners(index, spec.block_size)
    for strategy in ("corgipile", "block"):
        s = ShuffleSpec(strategy, spec.seed, spec.block_size, spec.buffer)
        for r in range(world):
            plan = make_plan(index, s, epoch, r, world)
            n = plan.blocks_per_window
            assert n == max(1, s.buffer_bytes(index.data_bytes) // s.block_size)
            for k in range(plan.n_windows):
                ids = plan.window(k)
                blocks = set(own[ids].tolist())
                assert len(blocks) == n or (k == plan.n_windows - 1 and len(blocks) < n)
                whole = set(np.flatnonzero(np.isin(own, list(blocks))).tolist())
                assert set(ids.tolist()) <= whole
                # a share cut at equal record counts may start or end inside a block
                cut = {int(own[plan.lo[0]]), int(own[plan.hi[-1] - 1])} if len(plan.lo) else set()
                assert {int(own[x]) for x in whole - set(ids.tolist())} <= cut
                if strategy == "block":  # whole blocks, one run each, in source order
                    assert len(runs(own[ids])) == len(blocks)
                    same = own[ids][1:] == own[ids][:-1]
                    assert np.all(np.diff(ids)[same] == 1)


def test_block_only_is_corgipile_without_the_inner_shuffle():
    index = make_index(np.random.default_rng(3).integers(1, 30, 500))
    a = make_plan(index, ShuffleSpec("block", 4, 64, 256), 1)
    b = make_plan(index, ShuffleSpec("corgipile", 4, 64, 256), 1)
    assert np.array_equal(a.window_sizes, b.window_sizes)
    inner_shuffled = False
    for k in range(a.n_windows):
        assert np.array_equal(np.sort(b.window(k)), np.sort(a.window(k)))
        inner_shuffled |= not np.array_equal(a.window(k), b.window(k))
    assert inner_shuffled


@settings(max_examples=40, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(1, 4))
def test_lirs_pages_stay_together_in_source_order(index, spec, epoch, world):
    index = index.body()  # a torn last line is planned apart (`torn.TornLast`)
    s = ShuffleSpec("lirs-page", spec.seed, spec.block_size, spec.buffer, spec.page_size)
    own = owners(index, s.page_size)
    for r in range(world):
        plan = make_plan(index, s, epoch, r, world)
        ws = windows(plan)
        cut = {int(own[plan.lo[0]]), int(own[plan.hi[-1] - 1])} if len(plan.lo) else set()
        for ids in ws:  # a page never straddles windows (a page at a rank's cut is shared by two ranks)
            whole = set(np.flatnonzero(np.isin(own, own[ids])).tolist())
            assert set(ids.tolist()) <= whole
            assert {int(own[x]) for x in whole - set(ids.tolist())} <= cut
        if ws:
            ids = np.concatenate(ws)
            pages = runs(own[ids])
            assert len(pages) == len(set(pages))
            same = own[ids][1:] == own[ids][:-1]
            assert np.all(np.diff(ids)[same] == 1)


def test_corgipile_plan_state_is_per_block_not_per_record():
    index = make_index(np.full(100_000, 10))  # 10 blocks of 100_000 bytes
    plan = make_plan(index, ShuffleSpec("corgipile", 1, 100_000, 300_000), 0)
    arrays = [v for v in vars(plan).values() if isinstance(v, np.ndarray)]
    assert arrays and max(a.size for a in arrays) <= 11
    assert index._lengths == []  # never asked for per-record lengths
    assert plan.n_windows == 4 and len(plan.window(0)) == 30_000


# ----------------------------------------------------------------------- sliding window


def sliding_window_loop(m, picks, drain):
    buf = list(range(len(drain)))
    out = []
    for t, j in enumerate(picks.tolist()):
        out.append(buf[j])
        buf[j] = len(drain) + t
    return out + [buf[j] for j in drain.tolist()]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), m=st.integers(0, 80), B=st.integers(1, 90))
def test_sliding_window_matches_the_sequential_process(data, m, B):
    B = min(B, m)
    picks = np.array(data.draw(st.lists(st.integers(0, max(B - 1, 0)), min_size=m - B, max_size=m - B)), np.int64)
    drain = np.array(data.draw(st.permutations(range(B))), np.int64)
    out = sliding_window_order(m, picks, drain)
    assert out.tolist() == sliding_window_loop(m, picks, drain)
    assert np.all(out < np.arange(m) + B)  # a record leaves at most B-1 steps ahead of its turn


def test_window_buffer_records_and_extremes():
    index = make_index([10] * 100)
    plan = make_plan(index, ShuffleSpec("window", buffer=95), 0)
    assert plan.buffer_records == 10 and plan.describe()["buffer_records"] == 10
    assert not np.array_equal(plan.order, np.arange(100))
    tiny = make_plan(index, ShuffleSpec("window", buffer=1), 0)
    assert tiny.buffer_records == 1 and np.array_equal(tiny.order, np.arange(100))
    for r in range(3):  # each rank slides over its own contiguous source range
        ids = make_plan(index, ShuffleSpec("window", buffer=1.0), 0, r, 3).order
        assert sorted(ids.tolist()) == list(range(*[(0, 34), (34, 67), (67, 100)][r]))


# ----------------------------------------------------------------------- helpers


@settings(max_examples=100, deadline=None)
@given(index=indexes(), unit=st.integers(1, 50))
def test_unit_firsts_groups_records_by_the_unit_of_their_first_byte(index, unit):
    own = owners(index, unit)
    expect = [i for i in range(index.n) if i == 0 or own[i] != own[i - 1]] + [index.n]
    assert unit_firsts(index.bounds, unit).tolist() == expect


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), max_size=40), target=st.integers(1, 120))
def test_cuts_by_bytes_groups_items_by_the_stretch_of_their_last_byte(sizes, target):
    cum = np.cumsum(np.array(sizes, np.int64))
    group = (cum - 1) // target
    expect = [0] + [i for i in range(1, len(sizes)) if group[i] != group[i - 1]] + [len(sizes)]
    assert cuts_by_bytes(cum, target).tolist() == (expect if sizes else [0])


@settings(max_examples=100, deadline=None)
@given(index=indexes(), target=st.integers(1, 120), chunk=st.integers(1, 7), seed=st.integers(0, 9))
def test_order_cuts_chunk_by_chunk_equal_cuts_over_the_whole_running_total(index, target, chunk, seed):
    order = np.random.default_rng(seed).permutation(index.n).astype(id_dtype(index.n))
    cum = np.cumsum(index.out_lengths(order))
    cuts, sizes = order_cuts(index, order, target, chunk)
    assert cuts.tolist() == cuts_by_bytes(cum, target).tolist()
    assert sizes.tolist() == [int(index.out_lengths(order[a:b]).sum()) for a, b in zip(cuts[:-1], cuts[1:])]


def test_concat_ranges():
    assert concat_ranges(np.array([5, 0, 9], np.int64), np.array([8, 2, 9], np.int64)).tolist() == [5, 6, 7, 0, 1]


# ----------------------------------------------------------------------- validation and reporting


@pytest.mark.parametrize(
    "spec",
    [
        ShuffleSpec("shuffle-everything"),
        ShuffleSpec(block_size=0),
        ShuffleSpec(page_size=-1),
        ShuffleSpec(buffer=0.0),
        ShuffleSpec(buffer=1.5),
        ShuffleSpec(buffer=float("nan")),
        ShuffleSpec(buffer=0),
        ShuffleSpec(seed=-1),
    ],
)
def test_invalid_specs_are_refused(spec):
    with pytest.raises(ValueError):
        make_plan(make_index([3] * 4), spec, 0)


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ValueError) as e:
        check_spec(ShuffleSpec("nope"))
    assert all(name in str(e.value) for name in STRATEGIES)


def test_rank_outside_world_is_refused():
    with pytest.raises(ValueError):
        make_plan(make_index([3] * 4), ShuffleSpec(), 0, 2, 2)


def test_help_and_describe_cover_every_strategy():
    assert set(STRATEGY_HELP) == set(STRATEGIES)
    index = spread_index()
    for name in ALL:
        d = make_plan(index, ShuffleSpec(name, **SPREAD), 0).describe()
        assert d["strategy"] == name and d["records"] == 200 and d["buffer_bytes"] == 200
    d = make_plan(index, ShuffleSpec("corgipile", **SPREAD), 0, 1, 2).describe()
    assert (d["block_size"], d["blocks"], d["blocks_in_share"], d["blocks_per_window"], d["rank"]) == (100, 20, 10, 2, 1)
