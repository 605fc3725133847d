"""Level: pure (no mount, no daemon).

What the README says of loader parts and `--even none`, per strategy: which strategies' parts,
read in order, are exactly the view; which only hold its records; how far rank shares differ."""

from __future__ import annotations

import numpy as np
import pytest

from shufflefs.strategies import make_plan
from shufflefs.strategies.base import ShuffleSpec
from test_strategies import ALL, make_index

RNG = np.random.default_rng(7)
INDEX = make_index(RNG.integers(20, 220, 6000), header=10, trailer=5)
CONCATENATED = ["none", "once", "full", "lirs-page", "block", "pls"]
SAME_RECORDS = ["corgipile", "stratified", "window"]


def order(plan) -> np.ndarray:
    return np.concatenate([plan.window(k) for k in range(plan.n_windows)]) if plan.n_windows else np.zeros(0, np.int64)


def view_and_parts(strategy: str, even: str, epoch: int, rank: int, world: int, parts: int):
    spec = ShuffleSpec(strategy=strategy, seed=5, block_size=4096, buffer=64 << 10, even=even)
    view = order(make_plan(INDEX, spec, epoch, rank, world))
    return view, np.concatenate([order(make_plan(INDEX, spec, epoch, rank, world, i, parts)) for i in range(parts)])


def test_every_strategy_is_in_one_list():
    assert sorted(CONCATENATED + SAME_RECORDS) == ALL


@pytest.mark.parametrize("strategy", ALL)
@pytest.mark.parametrize("even", ["none", "drop"])
def test_the_parts_in_order_are_the_view_or_hold_its_records(strategy, even):
    for epoch, rank, world, parts in [(0, 0, 1, 2), (1, 0, 1, 3), (0, 1, 3, 5), (2, 2, 3, 2)]:
        view, joined = view_and_parts(strategy, even, epoch, rank, world, parts)
        if strategy in CONCATENATED:
            assert np.array_equal(joined, view), (epoch, rank, world, parts)
        elif even == "none":  # the same records, each part shuffled inside its own share of the buffer
            assert np.array_equal(np.sort(joined), np.sort(view)) and not np.array_equal(joined, view)
        else:  # drop: as many records; which ones are left out may differ
            assert len(joined) == len(view)


@pytest.mark.parametrize("strategy", ALL)
def test_pad_repeats_records_of_the_share(strategy):
    for epoch, rank, world, parts in [(0, 1, 3, 2), (1, 2, 3, 5)]:
        view, joined = view_and_parts(strategy, "pad", epoch, rank, world, parts)
        assert len(joined) == len(view)  # the records repeated to fill a short share may differ
        assert set(np.unique(joined).tolist()) == set(np.unique(view).tolist())


@pytest.mark.parametrize("strategy", ALL)
def test_even_none_shares_differ_by_at_most_one_record(strategy):
    for block_size in (512, 4096, 65536):
        spec = ShuffleSpec(strategy=strategy, seed=1, block_size=block_size, buffer=32 << 10, even="none")
        for world in (2, 3, 7, 16):
            for epoch in (0, 1):
                counts = [int(np.asarray(make_plan(INDEX, spec, epoch, r, world).window_records).sum())
                          for r in range(world)]
                assert sum(counts) == INDEX.n and max(counts) - min(counts) <= 1, (block_size, world, counts)
