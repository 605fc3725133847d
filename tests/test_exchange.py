"""Partial local shuffling: a keyed slot exchange that keeps every record exactly once."""

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
    """Every rank's slots epoch by epoch, pushing each exchanged record to its receiver."""
    firsts, order, world = ex.firsts, ex.unit_order, ex.world
    slots = []
    for s in range(world):
        lo, hi = share(len(order), s, world)
        slots.append(np.array([i for u in order[lo:hi] for i in range(firsts[u], firsts[u + 1])], I64))
    m = [len(a) for a in slots]
    q = 0 if world == 1 else math.floor(ex.fraction * min(m))
    assert q == ex.q and m == list(ex.sizes)
    history = [slots]
    for t in range(1, epochs + 1):
        keys, offsets = ex.keys(t), ex.offsets(t)
        new = [a.copy() for a in slots]
        for s in range(world):
            idx = keyed_permutation(np.arange(m[s]), m[s], keys[s])
            for j in np.flatnonzero(idx < q):
                i = int(idx[j])
                r = (s + int(offsets[i])) % world
                dest = int(keyed_permutation(np.array([i]), m[r], keys[r], inverse=True)[0])
                new[r][dest] = slots[s][j]
        slots = new
        history.append(slots)
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
    assert not np.array_equal(c.offsets(1), a.offsets(1)) or not np.array_equal(c.keys(1), a.keys(1))


def test_offsets_never_point_a_rank_at_itself():
    ex = make([7] * 40, 5, 0.8, seed=2)
    for e in range(1, 4):
        o = ex.offsets(e)
        assert len(o) == ex.q and o.min() >= 1 and o.max() <= 4
        assert len(set(ex.exchanged_slots(1, e).tolist())) == ex.q
    assert len(np.unique(ex.offsets(1))) == 4  # every offset occurs


def test_ranks_without_records_exchange_nothing():
    ex = make([5, 5], 3, 1.0, seed=0)  # rank 2 gets no unit
    assert list(ex.sizes) == [5, 5, 0] and ex.q == 0
    assert ex.counts(0, 2) == {"records": 5, "kept": 5, "received": 0, "sent": 0}
    assert len(ex.partition(2, 3)) == 0
    solo = make([3, 4], 1, 1.0, seed=0)
    assert solo.q == 0 and np.array_equal(np.sort(solo.partition(0, 2)), np.arange(7))


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan"), True, "0.5", None])
def test_rejects_a_fraction_outside_zero_one(fraction):
    with pytest.raises(ValueError, match="fraction"):
        make([3, 3], 2, fraction, seed=0)


def test_rejects_bad_inputs():
    firsts = np.array([0, 3, 6], I64)
    with pytest.raises(ValueError):
        Exchange(firsts, np.array([0, 0]), 2, 0.5, 0)
    with pytest.raises(ValueError):
        Exchange(firsts, np.array([0, 1, 2]), 2, 0.5, 0)
    with pytest.raises(ValueError):
        Exchange(np.array([0, 4, 3]), np.array([0, 1]), 2, 0.5, 0)
    with pytest.raises(ValueError):
        Exchange(firsts, np.array([1, 0]), 0, 0.5, 0)
    with pytest.raises(ValueError):
        Exchange(firsts, np.array([1, 0]), 2, 0.5, -1)
    ex = Exchange(firsts, np.array([1, 0]), 2, 0.5, 0)
    with pytest.raises(ValueError):
        ex.partition(2, 0)
    with pytest.raises(ValueError):
        ex.counts(0, -1)
    with pytest.raises(ValueError):
        ex.partition(0, 0, previous=ex.partition(0, 0))
    with pytest.raises(ValueError):
        ex.partition(0, 1, previous=np.arange(2))


# -- scale ------------------------------------------------------------------------------------

def array_sizes(ex: Exchange) -> dict[str, int]:
    return {k: v.size for k, v in vars(ex).items() if isinstance(v, np.ndarray)}


def test_a_billion_records_on_1024_ranks_keeps_per_unit_state():
    units, world = 1000, 1024
    firsts = np.arange(units + 1, dtype=I64) * 1_000_000
    ex = Exchange(firsts, np.random.default_rng(0).permutation(units), world, 0.25, seed=9)
    assert max(array_sizes(ex).values()) <= world + 1
    assert sum(array_sizes(ex).values()) <= 4 * (units + world) + 4
    assert ex.counts(5, 3)["records"] == 1_000_000
    # fewer units than ranks: some ranks hold nothing, so balanced counts allow no exchange
    assert ex.sizes.min() == 0 and ex.q == 0 and ex.counts(5, 3)["kept"] == 1_000_000

    units = 2048
    firsts = np.linspace(0, 10**9, units + 1).astype(I64)
    order = np.random.default_rng(1).permutation(units)
    ex = Exchange(firsts, order, world, 0.25, seed=9)
    assert sum(array_sizes(ex).values()) <= 4 * (units + world) + 4
    assert int(ex.sizes.sum()) == 10**9 and ex.q == math.floor(0.25 * int(ex.sizes.min()))
    c = ex.counts(700, 3)
    assert c["received"] == c["sent"] == ex.q > 200_000 and c["kept"] == ex.sizes[700] - ex.q

    # one rank's partition at epoch 1: exactly q records come from other ranks' units
    p = ex.partition(700, 1)
    assert len(p) == ex.sizes[700] and len(np.unique(p)) == len(p) and p.dtype == np.int32
    unit_rank = np.empty(units, I64)
    for s in range(world):
        lo, hi = share(units, s, world)
        unit_rank[order[lo:hi]] = s
    home = unit_rank[np.searchsorted(firsts, p, side="right") - 1]
    assert int((home != 700).sum()) == ex.q


def test_one_rank_of_1024_over_ten_million_records():
    units, world = 4096, 1024
    firsts = np.linspace(0, 10**7, units + 1).astype(I64)
    ex = Exchange(firsts, np.random.default_rng(2).permutation(units), world, 0.5, seed=4)
    p2 = ex.partition(123, 2)
    p3 = ex.partition(123, 3)
    assert len(np.unique(p3)) == len(p3) == ex.sizes[123]
    assert p3.min() >= 0 and p3.max() < 10**7
    assert len(np.intersect1d(p2, p3)) == ex.sizes[123] - ex.q
    assert np.array_equal(ex.partition(123, 3, previous=p2), p3)


# --------------------------------------------------------------------------- CorgiPile inside


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.floats(0, 1), st.integers(0, 10))
def test_pls_corgipile_inside_reads_the_same_partition_in_few_blocks_per_window(world, epoch, q, seed):
    from shufflefs.index import RecordIndex
    from shufflefs.strategies import ShuffleSpec, make_plan

    lengths = np.random.default_rng(seed).integers(20, 200, 3000)
    index = RecordIndex(int(lengths.sum()), np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))
    block, buffer = 4096, 16384
    base = ShuffleSpec(strategy="pls", exchange=q, seed=seed, block_size=block, buffer=buffer)
    firsts = np.searchsorted(index.starts, np.arange(0, index.size + block, block))
    for r in range(world):
        uniform = make_plan(index, base, epoch, r, world)
        corgi = make_plan(index, ShuffleSpec(**{**base.__dict__, "pls_local": "corgipile"}), epoch, r, world)
        u = np.concatenate([uniform.window(k) for k in range(uniform.n_windows)])
        c = np.concatenate([corgi.window(k) for k in range(corgi.n_windows)])
        assert np.array_equal(np.sort(u), np.sort(c))  # the same partition, each record once
        # CorgiPile's shape: a window is whole block groups of the partition (the records of one
        # source block it holds), only its first and last group may continue in a neighbour
        group = np.searchsorted(firsts, c, side="right")
        group_windows = {}
        for k in range(corgi.n_windows):
            for g in np.unique(np.searchsorted(firsts, corgi.window(k), side="right")).tolist():
                group_windows.setdefault(g, []).append(k)
        assert all(ks == list(range(ks[0], ks[-1] + 1)) for ks in group_windows.values())  # contiguous
        if q == 0 and corgi.n_windows > 1:  # a partition of whole blocks: about buffer/block per window
            per_window = lambda p: np.mean([len(np.unique(np.searchsorted(firsts, p.window(k), side="right")))  # noqa: E731
                                            for k in range(p.n_windows - 1)])
            assert per_window(corgi) <= buffer // block + 3 < per_window(uniform)
        assert len(np.unique(group)) == len(group_windows)
        if len(c) > 1000:
            assert not np.array_equal(c, np.sort(c))  # shuffled
            assert not np.array_equal(u, c)
