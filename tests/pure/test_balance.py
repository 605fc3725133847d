"""Level: pure (no mount, no daemon).

Load-balanced rank assignment: coverage of records per `even` mode, step alignment of costs,
balance against a plain split, determinism, and numeric field costs from JSON Lines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.strategies.balance import (
    balanced_order,
    field_costs,
    noisy_costs,
    step_imbalance,
)
from shufflefs.strategies.units import id_dtype

# small values give many ties, large ones skew
int_costs = st.lists(st.one_of(st.integers(0, 5), st.integers(0, 10**6)), max_size=200)
float_costs = st.lists(st.floats(0, 1e6, allow_nan=False, allow_infinity=False), max_size=200)
any_costs = st.one_of(int_costs.map(lambda x: np.array(x, np.int64)),
                      float_costs.map(lambda x: np.array(x, np.float64)))
world = st.integers(1, 8)
level = st.floats(0.0, 1.0)
seed = st.integers(0, 2**32)
epoch = st.integers(0, 50)


def orders(costs, w, s, e, rl, even):
    return [balanced_order(costs, w, r, s, e, rl, even) for r in range(w)]


def chunk_spread(costs: np.ndarray, w: int) -> float:
    """Largest cost spread of ``w`` consecutive sorted costs: what one chunk can span."""
    s = np.sort(costs)
    if len(s) < w:
        return float(s[-1] - s[0]) if len(s) else 0.0
    return float((s[w - 1:] - s[: len(s) - w + 1]).max())


@settings(max_examples=150, deadline=None)
@given(any_costs, world, seed, epoch, level)
def test_none_uses_every_record_once(costs, w, s, e, rl):
    os_ = orders(costs, w, s, e, rl, "none")
    assert all(o.dtype == id_dtype(len(costs)) for o in os_)
    assert np.array_equal(np.sort(np.concatenate(os_)), np.arange(len(costs)))
    counts = [len(o) for o in os_]
    assert max(counts) - min(counts) <= 1
    assert sum(c == max(counts) for c in counts) == (len(costs) % w or w)


@settings(max_examples=150, deadline=None)
@given(any_costs, world, seed, epoch, level)
def test_drop_equal_counts_records_at_most_once(costs, w, s, e, rl):
    os_ = orders(costs, w, s, e, rl, "drop")
    assert {len(o) for o in os_} == {len(costs) // w}
    used = np.concatenate(os_)
    assert len(np.unique(used)) == len(used) == len(costs) - len(costs) % w


@settings(max_examples=150, deadline=None)
@given(any_costs, world, seed, epoch, level)
def test_pad_equal_counts_every_record_and_exact_duplicates(costs, w, s, e, rl):
    os_ = orders(costs, w, s, e, rl, "pad")
    n, k = len(costs), len(costs) % w
    assert {len(o) for o in os_} == {-(-n // w)}
    used = np.concatenate(os_)
    assert np.array_equal(np.unique(used), np.arange(n))
    assert len(used) - n == (w - k if k else 0)


@settings(max_examples=150, deadline=None)
@given(any_costs, world, seed, epoch, st.sampled_from(["none", "drop", "pad"]))
def test_without_noise_step_costs_span_at_most_one_chunk(costs, w, s, e, even):
    """Step i of every rank comes from one chunk of consecutive sorted costs (for "none" on
    every step all ranks have: the partial chunk is the last step)."""
    os_ = orders(costs, w, s, e, 0.0, even)
    steps = min(len(o) for o in os_)
    if steps == 0:
        return
    at_step = costs[np.stack([o[:steps] for o in os_])]
    bound = chunk_spread(costs, w)
    assert (at_step.max(axis=0) - at_step.min(axis=0) <= bound).all()
    if len(costs) >= w:  # (fewer records than ranks under "pad" repeat them cyclically)
        # inside a chunk the cheaper record goes to the lower rank (Bagua's column order)
        assert (np.diff(at_step, axis=0) >= 0).all()


def test_bagua_walkthrough_chunks():
    """The walkthrough's 12 complexities on 2 replicas: without noise the chunks are the
    consecutive pairs of the cost-sorted ids; each pair is one step on both ranks."""
    costs = np.array([7, 8, 11, 4, 5, 2, 9, 10, 0, 6, 1, 3])
    r0, r1 = orders(costs, 2, 0, 0, 0.0, "none")
    assert {(int(a), int(b)) for a, b in zip(r0, r1)} == {
        (8, 10), (5, 11), (3, 4), (9, 0), (1, 6), (7, 2)}


def test_partial_chunk_is_last_step_on_random_ranks_and_levels():
    costs = np.arange(23) * 10  # 23 = 5*4 + 3: three ranks get a sixth record
    short_ranks, levels, dropped = set(), set(), set()
    for e in range(40):
        os_ = orders(costs, 4, 1, e, 0.0, "none")
        short = [r for r, o in enumerate(os_) if len(o) == 5]
        assert len(short) == 1
        short_ranks.add(short[0])
        last = sorted(int(o[5]) for o in os_ if len(o) == 6)
        assert last == list(range(last[0], last[0] + 3))  # three consecutive sorted records
        assert last[0] % 4 == 0  # at a chunk level of the sorted order
        levels.add(last[0] // 4)
        kept = np.concatenate(orders(costs, 4, 1, e, 0.0, "drop"))
        dropped.add(tuple(np.setdiff1d(np.arange(23), kept)))
    assert short_ranks == {0, 1, 2, 3}
    assert len(levels) >= 4
    assert len(dropped) >= 4


def test_pad_repeats_neighbouring_costs():
    costs = np.arange(10) * 100  # 10 = 3*3 + 1: two duplicates per epoch
    for e in range(20):
        used = np.concatenate(orders(costs, 3, 5, e, 0.0, "pad"))
        dup = np.flatnonzero(np.bincount(used) > 1)
        assert len(dup) == 2 and len(used) == 12
        # the padded chunk is three consecutive sorted records: duplicates sit next to the partial one
        assert dup.max() - dup.min() <= 1


def test_fewer_records_than_ranks():
    costs = np.array([5, 1])
    assert sorted(len(o) for o in orders(costs, 4, 0, 0, 0.0, "none")) == [0, 0, 1, 1]
    assert all(len(o) == 0 for o in orders(costs, 4, 0, 0, 0.0, "drop"))
    pad = orders(costs, 4, 0, 0, 0.0, "pad")
    assert [int(o[0]) for o in pad] == [1, 0, 1, 0]  # cyclic over the sorted records
    for even in ("none", "drop", "pad"):
        assert all(len(o) == 0 for o in orders(np.zeros(0, np.int64), 3, 0, 0, 0.5, even))


def test_balancing_beats_a_plain_split():
    w, batch, n = 4, 8, 4096
    costs = np.random.default_rng(0).lognormal(6.0, 1.0, n).astype(np.int64)
    perm = np.random.default_rng(1).permutation(n)
    plain = step_imbalance(costs, np.array_split(perm, w), batch).mean()
    exact = step_imbalance(costs, orders(costs, w, 3, 1, 0.0, "none"), batch).mean()
    noisy = step_imbalance(costs, orders(costs, w, 3, 1, 0.5, "none"), batch).mean()
    assert exact < 1.05 < plain
    assert noisy < 0.9 * plain


@settings(max_examples=60, deadline=None)
@given(any_costs, world, seed, epoch, level, st.sampled_from(["none", "drop", "pad"]))
def test_deterministic_per_seed_and_epoch(costs, w, s, e, rl, even):
    a, b = orders(costs, w, s, e, rl, even), orders(costs.copy(), w, s, e, rl, even)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("rl", [0.0, 0.5])
@pytest.mark.parametrize("even", ["none", "drop", "pad"])
def test_epochs_differ(rl, even):
    costs = np.random.default_rng(2).integers(0, 1000, 500)
    first = orders(costs, 3, 7, 0, rl, even)
    for e in (1, 2):
        assert not all(np.array_equal(x, y) for x, y in zip(first, orders(costs, 3, 7, e, rl, even)))
    other_seed = orders(costs, 3, 8, 0, rl, even)
    assert not all(np.array_equal(x, y) for x, y in zip(first, other_seed))


def test_ties_are_broken_by_record_id():
    costs = np.zeros(12, np.int64)
    r0, r1, r2 = orders(costs, 3, 0, 0, 0.0, "none")
    assert {(int(a), int(b), int(c)) for a, b, c in zip(r0, r1, r2)} == {
        (0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)}


@settings(max_examples=100, deadline=None)
@given(int_costs.filter(len), seed, epoch, level)
def test_integer_noise_is_baguas(costs, s, e, rl):
    c = np.array(costs, np.int64)
    noise = noisy_costs(c, s, e, rl) - (c - c.min())
    limit = int((int(c.max()) - int(c.min())) * rl + 1)
    assert noise.dtype == np.int64 and (noise >= 0).all() and (noise < limit).all()


@settings(max_examples=100, deadline=None)
@given(float_costs.filter(len), seed, epoch, level)
def test_float_noise_is_uniform_in_level_range(costs, s, e, rl):
    c = np.array(costs, np.float64)
    noiseless = (c.max() - c.min()) * rl == 0  # the costs themselves, else less their minimum
    noise = noisy_costs(c, s, e, rl) - (c if noiseless else c - c.min())
    assert noise.dtype == np.float64
    assert (noise >= -1e-6).all() and (noise <= (c.max() - c.min()) * rl + 1e-6).all()


def test_noise_mixes_chunks_across_epochs():
    costs = np.arange(400)
    pairs = lambda e: {tuple(sorted(map(int, p))) for p in zip(*orders(costs, 2, 0, e, 0.3, "none"))}
    assert pairs(0) != pairs(1)
    assert pairs(0) != {(i, i + 1) for i in range(0, 400, 2)}  # not the noiseless chunks
    assert all(b - a < 0.3 * 400 + 2 for a, b in pairs(0))  # but records of close cost


@pytest.mark.parametrize("kwargs, match", [
    (dict(world=0), "world"),
    (dict(world=2, rank=2), "rank"),
    (dict(rank=-1), "rank"),
    (dict(random_level=1.5), "random_level"),
    (dict(random_level=-0.1), "random_level"),
    (dict(random_level=float("nan")), "random_level"),
    (dict(even="wrap"), "even"),
    (dict(costs=np.array([1, -2, 3])), "negative"),
    (dict(costs=np.array([1.0, np.nan])), "finite"),
    (dict(costs=np.array(["a", "b"])), "dtype"),
    (dict(costs=np.array([True, False])), "dtype"),
    (dict(costs=np.ones((2, 2))), "one-dimensional"),
    (dict(epoch=-1), "epoch"),
])
def test_rejects_bad_arguments(kwargs, match):
    args = dict(costs=np.array([3, 1, 2]), world=2, rank=0, seed=0, epoch=0) | kwargs
    with pytest.raises(ValueError, match=match):
        balanced_order(**args)


def test_step_imbalance():
    costs = np.array([1, 2, 3, 4, 0, 0, 5])
    got = step_imbalance(costs, [np.array([0, 1, 4]), np.array([2, 3, 5, 6])], batch=2)
    # step 0: 1+2 vs 3+4; step 1: record 4 (cost 0) vs records 5, 6 (cost 5)
    assert np.array_equal(got, [7 / 3, np.inf])
    assert np.array_equal(step_imbalance(costs, [np.array([4]), np.array([5])], 1), [1.0])
    assert len(step_imbalance(costs, [np.array([0]), np.zeros(0, np.int64)], 1)) == 0
    with pytest.raises(ValueError):
        step_imbalance(costs, [], 1)
    with pytest.raises(ValueError):
        step_imbalance(costs, [np.array([0])], 0)


# --- field_costs -------------------------------------------------------------------------------

def jsonl(records: list[str]) -> tuple[bytes, np.ndarray]:
    raw = [r.encode() + b"\n" for r in records]
    return b"".join(raw), np.concatenate(([0], np.cumsum([len(r) for r in raw]))).astype(np.int64)


ws = st.sampled_from(["", " ", "  ", "\t", " \n "])
numbers = st.one_of(
    st.integers(-10**12, 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.tuples(st.integers(-999, 999), st.sampled_from(["e", "E"]), st.sampled_from(["", "+", "-"]),
              st.integers(0, 30)).map(lambda t: f"{t[0]}{t[1]}{t[2]}{t[3]}"),
    st.tuples(st.integers(-99, 99), st.integers(0, 10**6)).map(lambda t: f"{t[0]}.{t[1]}"),
)
noise_fields = st.sampled_from([
    '"text": "a \\"len\\": 3, b"', '"lens": 9', '"xlen": 2', '"tags": ["len", 1]',
    '"obj": {"k": {"v": [1, 2]}}', '"s": "{\\"len\\": 4}"', '"n": null'])


@st.composite
def record(draw, key="len"):
    before = draw(st.lists(noise_fields, max_size=2))
    after = draw(st.lists(noise_fields, max_size=2))
    w = [draw(ws) for _ in range(4)]
    field = f'"{key}"{w[0]}:{w[1]}{draw(numbers)}{w[2]}'
    return "{" + w[3] + ", ".join([*before, field, *after]) + "}"


@settings(max_examples=100, deadline=None)
@given(st.lists(record(), max_size=30))
def test_field_costs_match_json(records):
    data, bounds = jsonl(records)
    got = field_costs(data, bounds, "len")
    want = [json.loads(r)["len"] for r in records]
    if all(isinstance(v, int) and -2**63 <= v < 2**63 for v in want):
        assert got.dtype == np.int64
        assert got.tolist() == want
    else:
        assert got.dtype == np.float64
        assert np.array_equal(got, np.array([float(v) for v in want]))


@settings(max_examples=30, deadline=None)
@given(st.lists(record(), min_size=1, max_size=10), st.data())
def test_field_costs_accepts_arrays_and_memoryviews_and_small_chunks(records, data_):
    data, bounds = jsonl(records)
    want = field_costs(data, bounds, "len")
    chunk = data_.draw(st.integers(1, 4))
    for buf in (np.frombuffer(data, np.uint8), memoryview(data)):
        assert np.array_equal(field_costs(buf, bounds, "len", chunk=chunk), want)


def test_field_costs_with_offset_bounds_and_unicode_key():
    header = b"# not a record\n"
    data, bounds = jsonl(['{"t\u00e9": 3}', '{"t\\u00e9": 4.5}', '{"a": 1, "t\u00e9":-2}'])
    got = field_costs(header + data, bounds + len(header), "t\u00e9")
    assert got.dtype == np.float64 and got.tolist() == [3.0, 4.5, -2.0]


def test_field_costs_missing_or_non_numeric_names_the_record():
    for bad in ('{"x": 1}', '{"len": "7"}', '{"len": null}', '{"len": true}', '{"len": [1]}',
                '{"x\\"len": 1}', '{"a": "\\"len\\": 1"}'):
        data, bounds = jsonl(['{"len": 1}', '{"len": 2}', bad, '{"len": 3}'])
        with pytest.raises(ValueError, match="record 2"):
            field_costs(data, bounds, "len")


def test_field_costs_nested_same_name():
    """Several matches: the top-level value (json.loads on those records).  A record whose only
    match is nested yields that value: the documented limitation."""
    data, bounds = jsonl(['{"meta": {"len": 5}, "len": 7}', '{"len": 8, "meta": {"len": 5}}',
                          '{"a": [{"len": 1}, {"len": 2}], "len": 9}', '{"meta": {"len": 6}}'])
    assert field_costs(data, bounds, "len").tolist() == [7, 8, 9, 6]
    data, bounds = jsonl(['{"len": 1}', '{"m": {"len": 5}, "n": {"len": 6}}'])
    with pytest.raises(ValueError, match="record 1"):
        field_costs(data, bounds, "len")


def test_field_costs_types():
    data, bounds = jsonl(['{"len": 1}', '{"len": 1.0}'])
    assert field_costs(data, bounds, "len").dtype == np.float64
    data, bounds = jsonl(['{"len": 1}', '{"len": 100000000000000000000}'])
    got = field_costs(data, bounds, "len")
    assert got.dtype == np.float64 and got[1] == 1e20
    assert field_costs(b"", np.zeros(1, np.int64), "len").shape == (0,)


def test_field_costs_feed_balanced_order():
    data, bounds = jsonl([json.dumps({"id": i, "tokens": (i * 37) % 101}) for i in range(50)])
    costs = field_costs(data, bounds, "tokens")
    os_ = orders(costs, 4, 0, 0, 0.0, "drop")
    at_step = costs[np.stack(os_)]
    assert (at_step.max(axis=0) - at_step.min(axis=0) <= chunk_spread(costs, 4)).all()


# --------------------------------------------------------------------------- the plan


def _index(lengths: np.ndarray):
    from shufflefs.index.table import RecordIndex

    return RecordIndex(int(lengths.sum()), np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))


def _stream(plan) -> np.ndarray:
    return np.concatenate([plan.window(k) for k in range(plan.n_windows)] or [np.zeros(0, np.int64)])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=300), st.integers(1, 5), st.integers(1, 3),
       st.sampled_from(["none", "pad", "drop"]), st.integers(0, 3), st.floats(0, 1), st.booleans())
def test_balanced_plan_is_the_assignment_split_into_parts_and_windows(lengths, world, parts, even, epoch, rl, by_field):
    from shufflefs.strategies import ShuffleSpec, make_plan

    lengths = np.array(lengths, np.int64)
    index = _index(lengths)
    costs = (lengths * 7 % 13).astype(np.int32) if by_field else None
    spec = ShuffleSpec(strategy="full", balance=True, balance_field="n" if by_field else None,
                       random_level=rl, even=even, buffer=2000)
    streams = []
    for r in range(world):
        whole = make_plan(index, spec, epoch, r, world, costs=costs)
        expect = balanced_order(costs if by_field else lengths, world, r, 0, epoch, rl, even if world > 1 else "none")
        got = _stream(whole)
        assert np.array_equal(got, expect)
        assert int(whole.rank_counts[r]) == len(got)
        assert np.array_equal(np.concatenate([_stream(make_plan(index, spec, epoch, r, world, i, parts, costs=costs))
                                              for i in range(parts)]), got)
        streams.append(got)
    every = np.concatenate(streams)
    if even == "none" or world == 1:
        assert np.array_equal(np.sort(every), np.arange(index.n))  # every record exactly once
    else:
        assert len({len(s) for s in streams}) == 1  # equal counts
        assert len(np.unique(every)) == len(every) if even == "drop" else set(every.tolist()) == set(range(index.n))


def test_balance_is_refused_where_it_cannot_hold():
    from shufflefs.strategies import ShuffleSpec, make_plan

    index = _index(np.full(10, 5, np.int64))
    with pytest.raises(ValueError, match="needs strategy full"):
        make_plan(index, ShuffleSpec(strategy="corgipile", balance=True), 0)
    with pytest.raises(ValueError, match="needs the records' costs"):
        make_plan(index, ShuffleSpec(strategy="full", balance=True, balance_field="n"), 0)
    with pytest.raises(ValueError, match="only used with balance"):
        make_plan(index, ShuffleSpec(strategy="full"), 0, costs=np.ones(10, np.int32))
    with pytest.raises(ValueError, match="random_level"):
        make_plan(index, ShuffleSpec(strategy="full", balance=True, random_level=1.5), 0)
    with pytest.raises(ValueError, match="costs for"):
        make_plan(index, ShuffleSpec(strategy="full", balance=True), 0, costs=np.ones(9, np.int32))


@pytest.mark.parametrize("step", [7, 97, 4096, 1 << 20])
def test_decoded_field_costs_over_steps_equal_the_whole_files(step: int):
    """A compressed file's costs, read from its decoded bytes a step at a time, are the costs of
    the whole bytes; a record without the field is named by its id wherever the steps cut."""
    from shufflefs.strategies.balance import RecordCostError
    from shufflefs.strategies.costs import decoded_field_costs

    rng = np.random.default_rng(step)
    lines = [json.dumps({"id": i, "tokens": int(rng.integers(1, 10**6)), "t": "x" * int(rng.integers(0, 300))})
             .encode() + b"\n" for i in range(2000)]
    data = b"".join(lines)
    bounds = np.concatenate([[0], np.cumsum([len(x) for x in lines])])
    steps = [data[i: i + step] for i in range(0, len(data), step)]
    assert np.array_equal(decoded_field_costs(iter(steps), bounds, "tokens"), field_costs(data, bounds, "tokens"))
    bad = data + b'{"id": 1}\n'
    with pytest.raises(RecordCostError) as e:
        decoded_field_costs(iter([bad[i: i + step] for i in range(0, len(bad), step)]),
                            np.append(bounds, len(bad)), "tokens")
    assert e.value.record == 2000


def test_float_costs_a_rounding_apart_keep_their_order_without_noise():
    """Costs that differ by less than subtracting the minimum can resolve (a tie, ordered by id,
    would give the dearer record to the lower rank) are kept apart."""
    big = 1e6
    costs = np.array([big, 1.2679066948219707, np.nextafter(big, 0)])
    r0, r1 = orders(costs, 2, 0, 0, 0.0, "none")
    assert costs[r0[0]] <= costs[r1[0]]
