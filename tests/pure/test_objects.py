"""Level: pure (no mount, no server).

How the runs of a window become ranged GETs of an object (`sources.objects.plan_requests`):
every run's bytes are found where the plan says, no request is longer than a part and its slack,
and runs are merged only across short gaps."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.sources.objects import ObjectInfo, plan_requests


@st.composite
def runs(draw):
    n = draw(st.integers(0, 40))
    gaps = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    starts, ends, pos = [], [], 0
    for g, s in zip(gaps, sizes):
        pos += g
        starts.append(pos)
        ends.append(pos + s)
        pos += s
    return np.array(starts, np.int64), np.array(ends, np.int64)


@settings(max_examples=300, deadline=None)
@given(r=runs(), gap=st.integers(1, 4000), part=st.integers(1, 6000))
def test_every_run_is_read_from_where_the_plan_puts_it(r, gap, part):
    starts, ends = r
    data = np.random.default_rng(0).integers(0, 256, int(ends[-1]) + 1 if len(ends) else 1, dtype=np.uint8)
    plan = plan_requests(starts, ends, gap=gap, part=part)
    lengths = plan.end - plan.start
    assert (lengths > 0).all() and (lengths <= part + part // 8).all()
    assert (plan.start[1:] >= plan.end[:-1]).all()  # ascending, disjoint
    bodies = np.concatenate([data[s:e] for s, e in zip(plan.start, plan.end)]) if len(plan.start) else data[:0]
    at = (np.cumsum(lengths) - lengths)[plan.run_req] + plan.run_at
    for s, e, a in zip(starts, ends, at):
        assert bodies[a: a + e - s].tobytes() == data[s:e].tobytes()
    # bytes read beyond the runs' own are only gaps shorter than ``gap``
    wasted = int(lengths.sum() - (ends - starts).sum())
    short = (starts[1:] - ends[:-1])
    assert wasted == int(short[short < gap].sum())


def test_a_new_etag_is_a_new_version_even_with_the_same_size_and_time():
    a = ObjectInfo("k", 10, '"abc"', 5)
    b = ObjectInfo("k", 10, '"abd"', 5)
    assert a.ino != b.ino and a.ino == ObjectInfo("other", 1, '"abc"', 0).ino and 0 <= a.ino < 2**63


def test_a_block_cut_at_record_ends_is_one_get_and_longer_runs_equal_parts():
    """An 8 MiB block ends at the first record end past 8 MiB: one GET, not 8 MiB and a GET of
    the record's tail; a run of 28 MiB is cut into four equal GETs (three would be longer than a part and its slack)."""
    MiB = 1 << 20
    starts = np.arange(0, 64 * MiB, 8 * MiB, dtype=np.int64) + np.arange(8) * 1000
    ends = starts + 8 * MiB + 900  # every block a record longer than 8 MiB, 100 bytes apart
    plan = plan_requests(starts, ends, gap=16, part=8 * MiB)
    assert len(plan.start) == 8 and (plan.end - plan.start == 8 * MiB + 900).all()
    long = plan_requests(np.array([0]), np.array([28 * MiB]), part=8 * MiB)
    assert (long.end - long.start).tolist() == [7 * MiB] * 4
