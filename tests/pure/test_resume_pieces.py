"""Resuming an epoch: any chain of stops and layouts serves every record exactly once, a resume on
the same layout is the rest of the uninterrupted view, and bad states are refused clearly."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.index.table import RecordIndex
from shufflefs.strategies import STRATEGIES, make_plan
from shufflefs.strategies.base import EVEN_MODES, ShuffleSpec
from shufflefs.strategies.resume import (ResumeError, ResumeState, Stop, consumed_pieces,
                                         resumed_pieces, resumed_plan, share_length)


def make_index(lengths) -> RecordIndex:
    bounds = np.concatenate(([0], np.cumsum(np.asarray(lengths, dtype=np.int64)))).astype(np.int64)
    return RecordIndex(int(bounds[-1]), bounds, False)


def _stream_positions(pieces) -> list[tuple[int, int]]:
    return [(s, x) for s, lo, hi in pieces for x in range(lo, hi)]


@st.composite
def chains(draw, max_streams=6, max_len=30):
    """First-layout stream lengths, a chain of stops (each consuming up to what its streams
    hold), and the final layout."""
    w0, k0 = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, max_len), min_size=w0 * k0, max_size=w0 * k0))
    shapes = [(w0, k0)] + [draw(st.sampled_from([(w0, k0), (draw(st.integers(1, 5)), draw(st.integers(1, 3)))]))
                           for _ in range(draw(st.integers(0, 3)))]
    final = draw(st.sampled_from([shapes[-1], (draw(st.integers(1, 5)), draw(st.integers(1, 3)))]))
    stops: list[Stop] = []
    for j, (w, k) in enumerate(shapes):
        streams = resumed_pieces(lengths, stops, w, k)
        consumed = tuple(tuple(draw(st.integers(0, sum(hi - lo for _, lo, hi in streams[r * k + i])))
                               for i in range(k)) for r in range(w))
        stops.append(Stop(w, k, consumed))
    return lengths, stops, final


@settings(max_examples=300, deadline=None)
@given(chains())
def test_consumed_and_served_hold_every_record_exactly_once(chain):
    lengths, stops, (w, k) = chain
    served = [p for st_ in resumed_pieces(lengths, stops, w, k) for p in st_]
    seen = Counter(_stream_positions(consumed_pieces(lengths, stops) + served))
    everything = {(s, x) for s, n in enumerate(lengths) for x in range(n)}
    assert set(seen) == everything and all(c == 1 for c in seen.values())


@settings(max_examples=300, deadline=None)
@given(chains())
def test_same_layout_continues_each_stream_and_a_new_one_cuts_the_rests_in_order(chain):
    lengths, stops, (w, k) = chain
    before = resumed_pieces(lengths, stops[:-1], *stops[-1].shape)
    last = stops[-1]
    rests = [_stream_positions(st_)[last.consumed[q // last.parts][q % last.parts]:] for q, st_ in enumerate(before)]
    after = [_stream_positions(st_) for st_ in resumed_pieces(lengths, stops, w, k)]
    if (w, k) == last.shape:
        assert after == rests  # each stream goes on where it stopped
    else:
        assert [x for a in after for x in a] == [x for r in rests for x in r]  # cut, never interleaved
        ranks = [sum(len(after[r * k + i]) for i in range(k)) for r in range(w)]
        assert max(ranks) - min(ranks) <= 1
        for r in range(w):
            parts = [len(after[r * k + i]) for i in range(k)]
            assert max(parts) - min(parts) <= 1


def test_counts_beyond_a_stream_are_refused():
    with pytest.raises(ResumeError, match="rank 1 part 0 consumed 6 records, but its view holds 5"):
        resumed_pieces([4, 5], [Stop(2, 1, ((0,), (6,)))], 2, 1)
    with pytest.raises(ResumeError, match="2 streams for a first layout of 3 x 1"):
        resumed_pieces([4, 5], [Stop(3, 1, ((0,), (0,), (0,)))], 1, 1)


STRATEGY_NAMES = sorted(STRATEGIES)


@settings(max_examples=150, deadline=None)
@given(strategy=st.sampled_from(STRATEGY_NAMES), seed=st.integers(0, 1000), lengths=st.lists(st.integers(1, 30), min_size=0, max_size=80),
       w0=st.integers(1, 3), k0=st.integers(1, 2), w1=st.integers(1, 4), k1=st.integers(1, 3),
       even=st.sampled_from(EVEN_MODES), balance=st.booleans(), data=st.data())
def test_resumed_plans_of_every_strategy_serve_the_rest_of_the_epoch(strategy, seed, lengths, w0, k0, w1, k1, even,
                                                                     balance, data):
    """A stop on (w0, k0), a resume on (w1, k1) that stops too, and a last layout: the records
    consumed and shown are the epoch's views' records, each once; on the same layout a view is
    the rest of its uninterrupted one.  Also with --even (the original views' padding or
    dropping is what is resumed) and --balance."""
    index = make_index(lengths)
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=32, buffer=200, page_size=16, even=even,
                       balance=balance and strategy == "full", exchange=0.5 if strategy == "pls" else 0.0)

    def plan_of(r, w, i, k):
        return make_plan(index, spec, 3, r, w, i, k)

    def ids(plan) -> np.ndarray:
        return np.concatenate([plan.window(j) for j in range(plan.n_windows)] or [np.zeros(0, np.int64)])

    orders = [ids(plan_of(r, w0, i, k0)) for r in range(w0) for i in range(k0)]
    everything = Counter(np.concatenate(orders).tolist()) if orders else Counter()
    stops: list[Stop] = []
    taken: Counter = Counter()
    for w, k in ((w0, k0), (w1, k1)):  # two stops, each on the views the layout was shown
        shown = [ids(resumed_plan(plan_of, stops, r, w, i, k)) for r in range(w) for i in range(k)]
        consumed = tuple(tuple(data.draw(st.integers(0, len(shown[r * k + i]))) for i in range(k)) for r in range(w))
        taken.update(x for r in range(w) for i in range(k) for x in shown[r * k + i][:consumed[r][i]].tolist())
        stops.append(Stop(w, k, consumed))
    w2, k2 = data.draw(st.sampled_from([(w1, k1), (w0, k0), (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3)))]))
    before = [ids(resumed_plan(plan_of, stops[:-1], r, w1, i, k1)) for r in range(w1) for i in range(k1)]
    served = Counter()
    for r in range(w2):
        for i in range(k2):
            plan = resumed_plan(plan_of, stops, r, w2, i, k2)
            got = ids(plan)
            assert len(got) == int(plan.window_records.sum())
            assert int(plan.window_sizes.sum()) == int(index.out_lengths(got).sum())
            for j in range(plan.n_windows):
                runs = plan.window_runs(j)
                if runs is not None:
                    first, count = runs
                    assert sorted(plan.window(j).tolist()) == [x for f, c in zip(first.tolist(), count.tolist())
                                                               for x in range(f, f + c)]
            if (w2, k2) == (w1, k1):  # the rest of the view the last layout was shown
                assert got.tolist() == before[r * k1 + i][stops[-1].consumed[r][i]:].tolist()
            served.update(got.tolist())
    assert taken + served == everything


def test_state_round_trips_and_names_views_by_their_mount_path():
    text = json.dumps({"epoch": 3, "views": {"./train.jsonl": [{"world_size": 2, "parts": 1, "consumed": [[5], [7]]}],
                                             "/shards/part-00000.jsonl": [{"world_size": 1, "consumed": [[0]]}]}})
    state = ResumeState.from_json(text)
    assert state.epoch == 3 and set(state.views) == {"train.jsonl", "shards/part-00000.jsonl"}
    assert state.stops("train.jsonl") == (Stop(2, 1, ((5,), (7,))),) and state.stops("other.jsonl") == ()
    assert ResumeState.from_json(state.to_json()) == state


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    ("[]", "JSON object with epoch and views"),
    ('{"views": {}}', "epoch must be an integer"),
    ('{"epoch": -1, "views": {}}', "epoch must be an integer from 0"),
    ('{"epoch": 1, "views": {}, "when": 3}', "unknown keys"),
    ('{"epoch": 1, "views": {"a": {}}}', "must be a list of layouts"),
    ('{"epoch": 1, "views": {"a": [{"world_size": 2, "consumed": [[1]]}]}}', "list of 2 lists"),
    ('{"epoch": 1, "views": {"a": [{"world_size": 1, "parts": 2, "consumed": [[1]]}]}}', "list of 2 counts"),
    ('{"epoch": 1, "views": {"a": [{"consumed": [[-3]]}]}}', r"consumed\[0\]\[0\] must be an integer"),
    ('{"epoch": 1, "views": {"a": [{"consumed": [[1.5]]}]}}', "must be an integer"),
    ('{"epoch": 1, "views": {"a": [{"world_size": 0, "consumed": []}]}}', "world_size must be an integer from 1"),
    ('{"epoch": 1, "views": {"../a": []}}', "may not contain"),
    ('{"epoch": 1, "views": {"": []}}', "non-empty string"),
    ('{"epoch": 1, "views": {"a": [], "./a": []}}', "twice"),
    ('{"epoch": 1, "views": {"a": [{"consumed": [[1]], "rank": 0}]}}', "unknown keys"),
    ('{"epoch": 1, "views": {"a": [{"world_size": 65536, "parts": 65536, "consumed": []}]}}', "more than 1048576 streams"),
])
def test_bad_states_say_what_is_wrong(text, message):
    with pytest.raises(ResumeError, match=message):
        ResumeState.from_json(text)


@settings(max_examples=200, deadline=None)
@given(strategy=st.sampled_from(STRATEGY_NAMES), seed=st.integers(0, 1000), lengths=st.lists(st.integers(1, 30), max_size=120),
       world=st.integers(1, 5), parts=st.integers(1, 4), exchange=st.floats(0, 1), block=st.integers(1, 64),
       buffer=st.integers(1, 400))
def test_share_length_is_every_strategys_stream_length(strategy, seed, lengths, world, parts, exchange, block, buffer):
    """What lets a resume on another layout skip planning the first layout's streams."""
    index = make_index(lengths)
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=block, buffer=buffer, page_size=16, exchange=exchange)
    for r in range(world):
        for i in range(parts):
            plan = make_plan(index, spec, 5, r, world, i, parts)
            assert int(plan.window_records.sum()) == share_length(index.n, r, world, i, parts)


@settings(max_examples=80, deadline=None)
@given(strategy=st.sampled_from(STRATEGY_NAMES), lengths=st.lists(st.integers(1, 30), min_size=1, max_size=80),
       w0=st.integers(1, 3), w1=st.integers(1, 4), k1=st.integers(1, 3), data=st.data())
def test_a_resume_with_known_lengths_equals_one_that_plans_them(strategy, lengths, w0, w1, k1, data):
    index = make_index(lengths)
    spec = ShuffleSpec(strategy=strategy, seed=9, block_size=32, buffer=200, page_size=16)

    def plan_of(r, w, i, k):
        return make_plan(index, spec, 1, r, w, i, k)

    sizes = [share_length(index.n, r, w0, 0, 1) for r in range(w0)]
    stops = [Stop(w0, 1, tuple((data.draw(st.integers(0, n)),) for n in sizes))]
    for r in range(w1):
        for i in range(k1):
            a = resumed_plan(plan_of, stops, r, w1, i, k1)
            b = resumed_plan(plan_of, stops, r, w1, i, k1, lambda r_, w, i_, k: share_length(index.n, r_, w, i_, k))
            ids = [np.concatenate([p.window(j) for j in range(p.n_windows)] or [np.zeros(0, np.int64)]) for p in (a, b)]
            assert ids[0].tolist() == ids[1].tolist()
