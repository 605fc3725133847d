"""Level: pure (no mount, no daemon).

Partial local shuffling: a keyed slot exchange that keeps every record exactly once."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.strategies.exchange import Exchange, Partitions, half_bits, keyed_permutation
from shufflefs.strategies.units import id_dtype, share

I64 = np.int64


# -- keyed permutation ------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**64 - 1))
def test_keyed_permutation_is_a_bijection_undone_by_its_inverse(m, key):
    x = np.arange(m, dtype=I64)
    y = keyed_permutation(x, m, key)
    assert y.dtype == I64 and y.shape == (m,)
    assert np.array_equal(np.sort(y), x)
    assert np.array_equal(keyed_permutation(y, m, key, inverse=True), x)
    assert np.array_equal(keyed_permutation(x, m, key, inverse=True)[y], x)


def test_keyed_permutation_of_many_domains_and_keys():
    for m in list(range(0, 70)) + [255, 256, 257, 1023, 1024, 1025, 4097, 65537]:
        for key in (0, 1, 7, 2**63, 2**64 - 1):
            y = keyed_permutation(np.arange(m), m, key)
            assert np.array_equal(np.sort(y), np.arange(m)), (m, key)
            assert np.array_equal(keyed_permutation(y, m, key, inverse=True), np.arange(m)), (m, key)


def test_keyed_permutation_values_of_mixed_domains_and_keys_in_one_call():
    gen = np.random.default_rng(3)
    domains = [(1, 5), (2, 9), (17, 2**64 - 3), (300, 11), (300, 12), (5000, 0)]
    xs, sizes, keys, expect = [], [], [], []
    for m, key in domains:
        x = gen.integers(0, m, size=40)
        xs.append(x), sizes.append(np.full(40, m)), keys.append(np.full(40, key, np.uint64))
        expect.append(keyed_permutation(x, m, key))
    order = gen.permutation(40 * len(domains))  # interleave the domains
    x, size, key = (np.concatenate(a)[order] for a in (xs, sizes, keys))
    y = keyed_permutation(x, size, key)
    assert np.array_equal(y, np.concatenate(expect)[order])
    assert np.array_equal(keyed_permutation(y, size, key, inverse=True), x)


def test_keyed_permutation_depends_on_the_key_and_mixes():
    x = np.arange(1000)
    a, b = keyed_permutation(x, 1000, 1), keyed_permutation(x, 1000, 2)
    assert not np.array_equal(a, b)
    assert (a == x).mean() < 0.05 and (a == b).mean() < 0.05
    # negative keys are taken modulo 2**64
    assert np.array_equal(keyed_permutation(x, 1000, -1), keyed_permutation(x, 1000, 2**64 - 1))


def test_keyed_permutation_rejects_values_outside_the_domain():
    with pytest.raises(ValueError):
        keyed_permutation(np.array([0, 5]), 5, 1)
    with pytest.raises(ValueError):
        keyed_permutation(np.array([-1]), 5, 1)
    with pytest.raises(ValueError):
        keyed_permutation(np.arange(3), np.array([4, 4]), 1)


def test_half_bits_is_the_smallest_fitting_half():
    sizes = [0, 1, 2, 3, 4, 5, 15, 16, 17, 2**20, 2**20 + 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62 + 1]
    for m, h in zip(sizes, half_bits(np.array(sizes, dtype=I64))):
        want = max(1, ((max(m - 1, 0)).bit_length() + 1) // 2)
        assert int(h) == want, m
        assert 4 ** int(h) >= m


# -- the exchange -----------------------------------------------------------------------------

def make(unit_sizes, world, fraction, seed, order_seed=0) -> Exchange:
    firsts = np.concatenate(([0], np.cumsum(np.asarray(unit_sizes, dtype=I64)))).astype(I64)
    order = np.random.default_rng(order_seed).permutation(len(unit_sizes))
    return Exchange(firsts, order, world, fraction, seed)


@st.composite
def exchanges(draw, fractions=st.floats(0.0, 1.0)):
    world = draw(st.integers(1, 6))
    # mostly at least one non-empty unit per rank, so that records do move
    units = draw(st.sampled_from([0, world, 2 * world, 3 * world]))
    sizes = draw(st.lists(st.integers(0, 12), min_size=units, max_size=max(units, 24)))
    return make(sizes, world, draw(fractions), draw(st.integers(0, 2**40)), draw(st.integers(0, 2**31)))


def all_partitions(ex: Exchange, epoch: int) -> list[np.ndarray]:
    return [ex.partition(r, epoch) for r in range(ex.world)]


def reference(ex: Exchange, epochs: int) -> list[list[np.ndarray]]:
    """Every rank's slots epoch by epoch, pushing the records of every moving layer to the rank
    its new offset names (a simulation of the rules, not of the closed form)."""
    firsts, order, world = ex.firsts, ex.unit_order, ex.world
    stream = np.array([i for u in order for i in range(firsts[u], firsts[u + 1])], I64)
    edges = [share(len(stream), s, world) for s in range(world)]
    slots = [stream[lo:hi].copy() for lo, hi in edges]
    m = len(stream) // world
    assert [len(a) for a in slots] == list(ex.sizes) and m == ex.layers
    q = 0 if world == 1 else math.floor(ex.fraction * m)
    assert q == ex.q
    history = [[a.copy() for a in slots]]
    era = np.zeros(m, I64)
    offset = np.zeros(m, I64)
    cursor = 0
    for t in range(1, epochs + 1):
        new = [a.copy() for a in slots]
        for _ in range(q):
            layer = cursor % m
            cursor += 1
            era[layer] += 1
            f = int(ex.offsets_at(np.array([layer]), np.array([era[layer]]))[0])
            assert f != offset[layer]  # a moving layer always changes rank
            for s in range(world):  # the layer's record on rank s moves by the change of offset
                j = int(keyed_permutation(np.array([layer]), m, int(ex._layer_keys[s]), inverse=True)[0])
                r = (s + f - int(offset[layer])) % world
                jr = int(keyed_permutation(np.array([layer]), m, int(ex._layer_keys[r]), inverse=True)[0])
                new[r][jr] = slots[s][j]
            offset[layer] = f
        slots = new
        history.append([a.copy() for a in slots])
    return history


@settings(max_examples=60, deadline=None)
@given(exchanges(), st.integers(0, 4))
def test_every_epoch_holds_every_record_exactly_once(ex, epoch):
    parts = all_partitions(ex, epoch)
    for r, p in enumerate(parts):
        assert len(p) == ex.sizes[r] == ex.counts(r, epoch)["records"]
        assert p.dtype == id_dtype(ex.n)
    joined = np.concatenate(parts) if parts else np.zeros(0, I64)
    assert np.array_equal(np.sort(joined), np.arange(ex.n))


@settings(max_examples=60, deadline=None)
@given(exchanges(), st.integers(1, 4))
def test_counts_are_the_records_that_actually_move(ex, epoch):
    before, after = all_partitions(ex, epoch - 1), all_partitions(ex, epoch)
    owner = {int(x): s for s, p in enumerate(before) for x in p}
    for r in range(ex.world):
        c = ex.counts(r, epoch)
        prev, cur = set(before[r].tolist()), set(after[r].tolist())
        received, sent = cur - prev, prev - cur
        assert len(prev & cur) == c["kept"] == ex.sizes[r] - ex.q
        assert len(received) == c["received"] == ex.q
        assert len(sent) == c["sent"] == ex.q
        assert all(owner[x] != r for x in received)
        # the slots whose record changed are exactly the exchanged ones
        changed = np.flatnonzero(before[r] != after[r])
        assert np.array_equal(changed, np.sort(ex.exchanged_slots(r, epoch)))
    m0 = int(ex.sizes[0])
    assert ex.counts(0, 0) == {"records": m0, "kept": m0, "received": 0, "sent": 0}


@settings(max_examples=40, deadline=None)
@given(exchanges(), st.integers(0, 4))
def test_matches_a_naive_simulation_of_the_exchange(ex, epochs):
    history = reference(ex, epochs)
    for e, slots in enumerate(history):
        for r in range(ex.world):
            assert np.array_equal(ex.partition(r, e), slots[r]), (e, r)


@settings(max_examples=40, deadline=None)
@given(exchanges())
def test_incremental_partition_equals_the_full_walk_back(ex):
    for r in range(ex.world):
        p = ex.partition(r, 0)
        for e in range(1, 5):
            p = ex.partition(r, e, previous=p)
            assert p.dtype == id_dtype(ex.n)
            assert np.array_equal(p, ex.partition(r, e)), (r, e)


@settings(max_examples=40, deadline=None)
@given(exchanges(), st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_partitions_asked_in_any_order_equal_the_full_walk_back(ex, epochs):
    for r in range(ex.world):
        parts = Partitions(ex, r)
        for e in epochs:
            got = parts(e)
            assert np.array_equal(got, ex.partition(r, e)), (r, e)
            got[:] = 0  # callers own what they get
        assert np.array_equal(parts(epochs[-1]), ex.partition(r, epochs[-1]))


@settings(max_examples=30, deadline=None)
@given(exchanges(fractions=st.just(0.0)))
def test_no_exchange_keeps_every_partition(ex):
    assert ex.q == 0
    first = all_partitions(ex, 0)
    for e in range(1, 5):
        for r, p in enumerate(all_partitions(ex, e)):
            assert np.array_equal(p, first[r])


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3), st.integers(1, 9), st.integers(0, 2**40))
def test_full_exchange_moves_every_record_to_another_rank(world, per_rank, unit, seed):
    ex = make([unit] * (world * per_rank), world, 1.0, seed)
    assert ex.q == per_rank * unit
    for e in range(1, 4):
        before, after = all_partitions(ex, e - 1), all_partitions(ex, e)
        for r in range(world):
            assert not set(before[r].tolist()) & set(after[r].tolist())


def test_deterministic_and_different_every_epoch_and_seed():
    a, b = make([10] * 20, 3, 0.5, seed=11), make([10] * 20, 3, 0.5, seed=11)
    for e in range(4):
        for r in range(3):
            assert np.array_equal(a.partition(r, e), b.partition(r, e))
    p = [a.partition(0, e) for e in range(4)]
    assert all(not np.array_equal(p[e], p[e + 1]) for e in range(3))
    assert not np.array_equal(p[0], p[3])
    c = make([10] * 20, 3, 0.5, seed=12)
    assert not np.array_equal(c.partition(0, 1), p[1])


def test_offsets_alternate_halves_and_use_every_rank():
    ex = make([7] * 40, 5, 0.8, seed=2)
    layers = np.arange(ex.layers)
    for era in range(1, 6):
        f = ex.offsets_at(layers, np.full(len(layers), era))
        assert ((f >= 3) if era % 2 else (f < 3)).all()
    assert np.array_equal(ex.offsets_at(layers, np.zeros(len(layers), I64)), np.zeros(len(layers)))
    seen = np.concatenate([ex.offsets_at(layers, np.full(len(layers), e)) for e in (1, 2)])
    assert set(seen.tolist()) == {0, 1, 2, 3, 4}
    for e in range(1, 4):
        assert len(set(ex.exchanged_slots(1, e).tolist())) == ex.q


def test_partitions_are_equal_within_one_record_and_never_empty_when_there_are_enough_records():
    ex = make([5, 5], 3, 1.0, seed=0)  # 10 records, 3 ranks, 2 units
    assert list(ex.sizes) == [4, 3, 3] and ex.q == 3
    for e in range(4):
        assert sorted(np.concatenate(all_partitions(ex, e)).tolist()) == list(range(10))
    few = make([1, 1], 3, 1.0, seed=0)  # fewer records than ranks: nothing to exchange
    assert list(few.sizes) == [1, 1, 0] and few.q == 0
    assert few.counts(0, 2) == {"records": 1, "kept": 1, "received": 0, "sent": 0}
    assert len(few.partition(2, 3)) == 0
    solo = make([3, 4], 1, 1.0, seed=0)
    assert solo.q == 0 and np.array_equal(np.sort(solo.partition(0, 2)), np.arange(7))


@settings(max_examples=40, deadline=None)
@given(exchanges(), st.sampled_from([10**3, 10**9, 10**12, 2**62, 2**63 - 2]))
def test_any_epoch_holds_every_record_once_with_the_exact_counts(ex, epoch):
    parts = all_partitions(ex, epoch)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(ex.n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    before = all_partitions(ex, epoch - 1)
    for r in range(ex.world):
        assert len(set(before[r].tolist()) - set(parts[r].tolist())) == ex.q


def test_a_plan_at_epoch_a_billion_of_100k_records_builds():
    from shufflefs.index.table import RecordIndex
    from shufflefs.strategies import ShuffleSpec, make_plan

    bounds = np.arange(0, 100_001 * 10, 10, dtype=I64)
    index = RecordIndex(int(bounds[-1]), bounds)
    spec = ShuffleSpec(strategy="pls", exchange=0.25, block_size=4096, buffer=64 << 10)
    ids = [np.concatenate([p.window(k) for k in range(p.n_windows)])
           for p in (make_plan(index, spec, 10**9, r, 4) for r in range(4))]
    assert sorted(map(len, ids)) == [25_000] * 4
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(100_000))
