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
from shufflefs.strategies.resume import (ResumedPlan, ResumeError, ResumeState, Stop, consumed_pieces,
                                         resumed_pieces)


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
    """Also with --even (the original views' padding or dropping is what is resumed) and --balance."""
    index = make_index(lengths)
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=32, buffer=200, page_size=16, even=even,
                       balance=balance and strategy == "full", exchange=0.5 if strategy == "pls" else 0.0)
    plans = [make_plan(index, spec, 3, r, w0, i, k0) for r in range(w0) for i in range(k0)]
    orders = [np.concatenate([p.window(j) for j in range(p.n_windows)] or [np.zeros(0, np.int64)]) for p in plans]
    consumed = tuple(tuple(data.draw(st.integers(0, len(orders[r * k0 + i]))) for i in range(k0)) for r in range(w0))
    stops = [Stop(w0, k0, consumed)]
    taken = [orders[r * k0 + i][:consumed[r][i]] for r in range(w0) for i in range(k0)]
    shown = []
    for r in range(w1):
        for i in range(k1):
            pieces = resumed_pieces([len(o) for o in orders], stops, w1, k1)[r * k1 + i]
            plan = ResumedPlan(plans[0], [(plans[s], lo, hi) for s, lo, hi in pieces], r, w1, i, k1)
            ids = [plan.window(j) for j in range(plan.n_windows)]
            got = np.concatenate(ids) if ids else np.zeros(0, np.int64)
            assert len(got) == int(plan.window_records.sum())
            assert int(plan.window_sizes.sum()) == int(index.out_lengths(got).sum())
            for j in range(plan.n_windows):
                runs = plan.window_runs(j)
                if runs is not None:
                    first, count = runs
                    assert sorted(ids[j].tolist()) == [x for f, c in zip(first.tolist(), count.tolist()) for x in range(f, f + c)]
            if (w1, k1) == (w0, k0):  # the rest of the uninterrupted view
                assert got.tolist() == orders[r * k1 + i][consumed[r][i]:].tolist()
            shown.append(got)
    everything = Counter(np.concatenate(orders).tolist()) if orders else Counter()
    assert Counter(np.concatenate(taken + shown).tolist()) == everything


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
])
def test_bad_states_say_what_is_wrong(text, message):
    with pytest.raises(ResumeError, match=message):
        ResumeState.from_json(text)
