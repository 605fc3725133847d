"""Level: pure (no mount, no daemon).

Rank shares, loader parts and equal counts: every record exactly once (or as padding/dropping says)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.strategies import make_plan
from shufflefs.strategies.base import ShuffleSpec
from shufflefs.strategies.units import id_dtype, share_edges, share
from test_strategies import ALL, indexes, make_index, specs


def stream(index, spec, epoch, rank, world, parts):
    """A rank's records: its parts read one after the other, and each part's windows checked."""
    out = []
    for p in range(parts):
        plan = make_plan(index, spec, epoch, rank, world, p, parts)
        for k in range(plan.n_windows):
            ids = plan.window(k)
            assert ids.dtype == id_dtype(index.n) and len(ids) > 0
            assert len(np.unique(ids)) == len(ids)  # a window never holds a record twice
            assert plan.window_sizes[k] == index.out_lengths(ids).sum()
            out.append(ids)
    return np.concatenate(out) if out else np.empty(0, np.int64)


@settings(max_examples=80, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(1, 4), parts=st.integers(1, 3))
def test_ranks_and_parts_hold_every_record_exactly_once(index, spec, epoch, world, parts):
    streams = [stream(index, spec, epoch, r, world, parts) for r in range(world)]
    allids = np.concatenate(streams)
    assert np.array_equal(np.sort(allids), np.arange(index.n))
    # the parts of a rank hold the records of its undivided share
    for r in range(world):
        assert np.array_equal(np.sort(streams[r]), np.sort(stream(index, spec, epoch, r, world, 1)))


@settings(max_examples=80, deadline=None)
@given(index=indexes(), spec=specs, epoch=st.integers(0, 3), world=st.integers(2, 5), parts=st.integers(1, 3),
       even=st.sampled_from(["pad", "drop"]))
def test_pad_and_drop_give_every_rank_the_same_count(index, spec, epoch, world, parts, even):
    spec = ShuffleSpec(**{**spec.__dict__, "even": even})
    exact = [stream(index, ShuffleSpec(**{**spec.__dict__, "even": "none"}), epoch, r, world, 1) for r in range(world)]
    counts = [len(s) for s in exact]
    streams = [stream(index, spec, epoch, r, world, parts) for r in range(world)]
    target = max(counts) if even == "pad" else min(counts)
    assert [len(s) for s in streams] == [target] * world
    allids = np.concatenate(streams)
    uses = np.bincount(allids.astype(np.int64), minlength=index.n)
    if even == "pad":
        assert np.all(uses >= 1) and int(uses.sum()) == index.n + sum(target - c for c in counts)
        for s, e in zip(streams, exact):  # a rank's own records first, exactly once, then repeats
            assert np.array_equal(np.sort(s[: len(e)]), np.sort(e))
    else:
        assert np.all(uses <= 1) and int(uses.sum()) == world * target
        for s, e in zip(streams, exact):  # each rank keeps a piece of its own share
            assert np.isin(s, e).all()


@pytest.mark.parametrize("strategy", ALL)
def test_plans_report_the_count_of_every_rank(strategy):
    index = make_index(np.arange(1, 200) % 37 + 1)
    spec = ShuffleSpec(strategy=strategy, block_size=64, buffer=300, page_size=16)
    world = 3
    plans = [make_plan(index, spec, 1, r, world) for r in range(world)]
    counts = [sum(len(p.window(k)) for k in range(p.n_windows)) for p in plans]
    for p in plans:
        assert list(p.rank_counts) == counts
        assert p.describe()["rank"] == p.rank and p.describe()["world"] == world


def test_share_edges_match_share():
    for count in range(0, 30):
        for world in range(1, 7):
            edges = share_edges(count, world)
            assert [tuple(edges[r: r + 2]) for r in range(world)] == [share(count, r, world) for r in range(world)]


def test_parts_outside_range_and_unknown_even_are_refused():
    index = make_index([3] * 10)
    with pytest.raises(ValueError, match="part"):
        make_plan(index, ShuffleSpec(), 0, 0, 1, 2, 2)
    with pytest.raises(ValueError, match="even"):
        make_plan(index, ShuffleSpec(even="always"), 0, 0, 2)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=150), world=st.integers(2, 4),
       q=st.floats(0.0, 1.0), seed=st.integers(0, 2**32), epoch=st.integers(1, 3))
def test_pls_ranks_keep_all_but_the_exchanged_fraction(lengths, world, q, seed, epoch):
    index = make_index(lengths)
    spec = ShuffleSpec(strategy="pls", block_size=40, buffer=120, seed=seed, exchange=q)
    before = [set(stream(index, spec, epoch - 1, r, world, 1).tolist()) for r in range(world)]
    after = [set(stream(index, spec, epoch, r, world, 1).tolist()) for r in range(world)]
    plans = [make_plan(index, spec, epoch, r, world) for r in range(world)]
    sizes = [len(b) for b in before]
    sent = int(q * min(sizes))  # every rank sends (and receives) the same number
    for r, plan in enumerate(plans):
        info = plan.describe()
        assert len(after[r]) == sizes[r] == info["partition_records"]  # partitions keep their size
        assert len(after[r] & before[r]) == info["kept"] == sizes[r] - sent
        assert info["received"] == info["sent"] == sent
        received = after[r] - before[r]
        assert all(not (received & after[s]) for s in range(world) if s != r)


def test_pls_exchange_zero_keeps_partitions_and_one_moves_everything():
    index = make_index([10] * 400)
    for q, stays in ((0.0, True), (1.0, False)):
        spec = ShuffleSpec(strategy="pls", block_size=100, buffer=500, exchange=q)
        for r in range(4):
            a = set(stream(index, spec, 2, r, 4, 1).tolist())
            b = set(stream(index, spec, 3, r, 4, 1).tolist())
            assert (a == b) == stays and (stays or not (a & b))
