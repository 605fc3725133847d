"""Level: pure (no mount, no daemon).

The stratified order (`strategies.stratified`): every buffer a stratified sample of the file's
blocks, each block in a uniformly random group, CorgiPile's reads; what it does to the label mix
of a sorted file against CorgiPile at the same blocks per buffer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.quality.metrics import label_mix_tv
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.stratified import stratified_order
from test_strategies import indexes, make_index


@settings(max_examples=200, deadline=None)
@given(n_units=st.integers(0, 400), per_group=st.integers(1, 70), seed=st.integers(0, 2**32))
def test_each_group_takes_one_unit_of_each_stratum_of_equal_length(n_units, per_group, seed):
    order, starts = stratified_order(n_units, per_group, np.random.default_rng(seed))
    assert np.array_equal(np.sort(order), np.arange(n_units))
    if n_units == 0:
        assert list(starts) == [0]
        return
    groups = -(-n_units // per_group)
    strata = -(-n_units // groups)  # strata of `groups` consecutive units, the last one shorter
    assert len(starts) == groups + 1 and starts[-1] == n_units
    sizes = np.diff(starts)
    assert sizes.max() <= min(per_group, strata) and sizes.min() >= strata - 1

    # after one rotation of the file, every group holds one unit of each full stratum
    def one_per_stratum(r: int) -> bool:
        full = (strata - 1) if n_units % groups else strata
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
            which = ((order[a:b] - r) % n_units) // groups
            if len(set(which.tolist())) != b - a or not set(range(full)) <= set(which.tolist()):
                return False
        return True

    assert any(one_per_stratum(r) for r in range(n_units))


def test_blocks_land_in_every_group_alike():
    """Over many epochs a block's group is uniform: no group is always short or always first."""
    n_units, per_group, epochs = 50, 8, 4000
    groups = -(-n_units // per_group)
    seen = np.zeros((n_units, groups), np.int64)
    for e in range(epochs):
        order, starts = stratified_order(n_units, per_group, np.random.default_rng([1, e]))
        g = np.searchsorted(starts, np.arange(n_units), side="right") - 1
        seen[order, g] += 1
    expected = epochs / groups
    assert np.all(np.abs(seen - expected) < 6 * np.sqrt(expected))


@settings(max_examples=60, deadline=None)
@given(index=indexes(max_records=120), seed=st.integers(0, 2**40), block_size=st.integers(1, 64),
       buffer=st.integers(1, 400), epoch=st.integers(0, 3), world=st.integers(1, 4), parts=st.integers(1, 3))
def test_windows_hold_whole_blocks_of_one_group_within_the_part_buffer(index, seed, block_size, buffer, epoch,
                                                                       world, parts):
    index = index.body()  # a torn last line is planned apart (`torn.TornLast`)
    spec = ShuffleSpec("stratified", seed, block_size, buffer)
    for r in range(world):
        for p in range(parts):
            plan = make_plan(index, spec, epoch, r, world, p, parts)
            full = make_plan(index, spec, epoch, 0, 1)
            own = np.searchsorted(full.firsts, np.arange(index.n), side="right") - 1
            group_of = {}
            for g in range(len(full.group_starts) - 1):
                for u in full.units[full.group_starts[g]: full.group_starts[g + 1]].tolist():
                    group_of[u] = g
            for k in range(plan.n_windows):
                blocks = set(own[plan.window(k)].tolist())
                assert len(blocks) <= plan.blocks_per_window + 2  # a share may start and end inside a block
                assert len({group_of[b] for b in blocks}) == 1


def sorted_file(n_records: int = 200_000, labels: int = 10, record: int = 100):
    index = make_index(np.full(n_records, record))
    return index, np.repeat(np.arange(labels), n_records // labels)


@pytest.mark.parametrize("blocks_per_buffer", [16, 64, 256])
def test_a_sorted_file_mixes_better_than_corgipile_at_equal_blocks(blocks_per_buffer):
    index, labels = sorted_file()
    block = 4096
    spec = dict(seed=3, block_size=block, buffer=block * blocks_per_buffer)
    mixes = {}
    for s in ("corgipile", "stratified"):
        plan = make_plan(index, ShuffleSpec(s, **spec), 2)
        order = np.concatenate([plan.window(k) for k in range(plan.n_windows)])
        mixes[s] = label_mix_tv(order, labels, 1000)
    uniform = label_mix_tv(np.random.default_rng(0).permutation(len(labels)), labels, 1000)
    assert mixes["stratified"] < 0.75 * mixes["corgipile"]
    if blocks_per_buffer >= 64:
        assert mixes["stratified"] < 2 * uniform


def test_each_full_window_of_a_sorted_file_holds_every_label_in_proportion():
    """One block per stratum: a label's blocks in a window differ from n/10 by less than 2."""
    index, labels = sorted_file()
    block, n = 4000, 50  # 40 records per block, 500 blocks, 10 groups of 50
    plan = make_plan(index, ShuffleSpec("stratified", 9, block, block * n), 1)
    for k in range(plan.n_windows):
        ids = plan.window(k)
        counts = np.bincount(labels[ids], minlength=10) / 40
        assert np.all(np.abs(counts - len(ids) / 400) < 2), counts


def test_the_default_is_stratified_and_the_automatic_block_fills_a_buffer_with_hundreds():
    from shufflefs.strategies.base import AUTO_BUFFER_BLOCKS, effective_block_size

    spec = ShuffleSpec()
    assert spec.strategy == "stratified"
    assert spec.buffer_bytes(1 << 30) // effective_block_size(spec, 1 << 30) == AUTO_BUFFER_BLOCKS
    floor = ShuffleSpec(block_floor=1 << 20)
    assert effective_block_size(floor, 1 << 30) == 1 << 20
    small = effective_block_size(spec, 1 << 20)  # a file of 1 MiB keeps 64 blocks
    assert (1 << 20) // small == 64
