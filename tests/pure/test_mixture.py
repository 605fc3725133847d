"""A mixture's epochs: each source gives its weight's share of the samples (counts within one,
summing exactly), every record of a source once before any repeats (a down-sampled source gives
the next slice each epoch, an up-sampled one whole passes plus a slice), a pure function of
(seed, epoch, table), and interleaved so that every stretch holds each source's share, within
about a record per source."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.strategies.mixture import epoch_records, interleave, pass_order, quotas

weights_st = st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=6).filter(lambda w: sum(w) > 0)


@given(st.integers(0, 10**9), weights_st)
def test_quotas_add_up_and_stay_within_one_of_the_share(samples, weights):
    q = quotas(samples, weights)
    assert q.sum() == samples and (q >= 0).all()
    exact = samples * np.asarray(weights) / sum(weights)
    assert np.all(np.abs(q - exact) < 1 + 1e-6 * samples)
    assert np.all(q[np.asarray(weights) == 0] == 0)


def test_quotas_of_huge_and_tiny_weights_still_add_up():
    assert quotas(10, [1e308, 1e308, 1e308]).tolist() == [4, 3, 3]
    assert quotas(7, [1e-320, 3e-320]).sum() == 7
    assert quotas(2**62, [1, 1]).sum() == 2**62 and quotas(2**62, [1, 2]).tolist() == [2**62 // 3, 2**63 // 3 + 1]


@pytest.mark.parametrize("samples,weights", [(-1, [1]), (10, []), (10, [0, 0]), (10, [1, -1]), (10, [float("nan")])])
def test_quotas_refuse_nonsense(samples, weights):
    with pytest.raises(ValueError):
        quotas(samples, weights)


@given(st.integers(0, 2**31), st.integers(0, 50), st.integers(1, 3000), st.integers(1, 64))
@settings(max_examples=60)
def test_a_pass_is_a_permutation_of_runs(seed, source, n, run):
    order = pass_order(seed, source, 3, n, run)
    assert np.array_equal(np.sort(order), np.arange(n))
    # runs of ``run`` consecutive ids, each starting at a multiple of ``run``
    starts = np.flatnonzero(np.diff(order, prepend=-2) != 1)
    assert np.all(order[starts] % run == 0)
    assert np.array_equal(pass_order(seed, source, 3, n, run), order)


@given(st.integers(0, 2**31), st.integers(1, 500), st.integers(1, 1200), st.integers(1, 8), st.integers(1, 9))
@settings(max_examples=80)
def test_no_record_repeats_before_every_record_was_taken(seed, n, take, run, epochs):
    stream = np.concatenate([epoch_records(seed, e, 0, n, take, run) for e in range(epochs)])
    assert len(stream) == epochs * take
    for p in range(len(stream) // n):  # every whole pass: each record once
        assert np.array_equal(np.sort(stream[p * n: (p + 1) * n]), np.arange(n))
    tail = stream[(len(stream) // n) * n:]
    assert len(np.unique(tail)) == len(tail)  # the pass under way: no repeats yet
    counts = np.bincount(stream, minlength=n)
    assert counts.max() - counts.min() <= 1  # no record ahead of another by more than one pass


@given(st.integers(0, 2**31), st.integers(2, 400), st.integers(1, 8))
@settings(max_examples=40)
def test_a_downsampled_source_gives_new_records_each_epoch_and_an_upsampled_one_whole_passes(seed, n, k):
    take = max(1, n // k)
    seen = [set(epoch_records(seed, e, 1, n, take).tolist()) for e in range(n // take)]
    for a in range(len(seen)):
        for b in range(a + 1, len(seen)):
            assert not seen[a] & seen[b]  # within a pass, epochs never share a record
    up = epoch_records(seed, 2, 1, n, k * n + n // 2)
    counts = np.bincount(up, minlength=n)
    assert counts.sum() == k * n + n // 2 and counts.min() >= k - 1 and counts.max() <= k + 2


def test_the_same_inputs_give_the_same_records_and_epochs_differ():
    a = epoch_records(7, 3, 0, 10_000, 2_500, run=16)
    assert np.array_equal(a, epoch_records(7, 3, 0, 10_000, 2_500, run=16))
    assert not np.array_equal(a, epoch_records(7, 4, 0, 10_000, 2_500, run=16))
    assert not np.array_equal(a, epoch_records(8, 3, 0, 10_000, 2_500, run=16))
    assert not np.array_equal(a, epoch_records(7, 3, 1, 10_000, 2_500, run=16))  # sources draw apart
    with pytest.raises(ValueError):
        epoch_records(7, 0, 0, 0, 5)
    assert len(epoch_records(7, 0, 0, 0, 0)) == 0


@given(st.lists(st.integers(0, 3000), min_size=1, max_size=5).filter(lambda t: sum(t) > 0), st.integers(50, 1000))
@settings(max_examples=300)
def test_every_stretch_holds_each_sources_share(takes, m):
    order = interleave(takes)
    total = sum(takes)
    assert np.array_equal(np.bincount(order, minlength=len(takes)), takes)
    m = min(m, total)
    for i, t in enumerate(takes):
        inside = np.convolve((order == i).astype(np.int64), np.ones(m, np.int64), mode="valid")
        # each other source can put at most about one record more than its share in the way
        assert np.all(np.abs(inside - m * t / total) <= max(2, len(takes))), (i, t, m, inside.min(), inside.max())


def test_sources_of_one_record_each_are_spread_out():
    order = interleave([1, 1, 1, 148])  # found by the property above before sources had phases
    assert np.all(np.diff(np.flatnonzero(order != 3)) >= 30)


def test_a_huge_source_costs_memory_for_its_runs_only():
    # a billion records in runs of 4096: one pass's permutation is of 244,141 runs
    got = epoch_records(1, 5, 0, 10**9, 100_000, run=4096)
    assert len(got) == 100_000 and len(np.unique(got)) == 100_000
