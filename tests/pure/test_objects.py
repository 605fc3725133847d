"""Level: pure (no mount, no server).

How the runs of a window become ranged GETs of an object (`sources.objects.plan_requests`):
every run's bytes are found where the plan says, no request is longer than a part, and runs are
merged only across short gaps."""

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
    assert (lengths > 0).all() and (lengths <= part).all()
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
