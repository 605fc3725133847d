"""Level: pure (no mount, no daemon).

Block summaries: the block plans made from per-block counts equal those made from the record index."""

from __future__ import annotations

import importlib.util
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.strategies import make_plan
from shufflefs.strategies.base import ShuffleSpec
from shufflefs.strategies.summary import BlockSummary
from test_strategies import make_index

REPO = Path(__file__).resolve().parents[2]


@st.composite
def indexes(draw, max_records=300):
    lengths = draw(st.lists(st.integers(0, 300), max_size=max_records))
    return make_index(lengths, draw(st.integers(0, 100)), draw(st.integers(0, 50)), draw(st.booleans()))


buffers = st.one_of(st.integers(1, 8000), st.floats(0.01, 1.0))


def assert_same_plan(a, b) -> None:
    assert a.n_windows == b.n_windows
    assert np.array_equal(a.window_sizes, b.window_sizes)
    assert np.array_equal(getattr(a, "inner", a).rank_counts, getattr(b, "inner", b).rank_counts)
    for k in range(a.n_windows):
        wa, wb = a.window(k), b.window(k)
        assert wa.dtype == wb.dtype and np.array_equal(wa, wb)
    assert a.describe() == b.describe()


def order(plan) -> np.ndarray:
    ws = [plan.window(k) for k in range(plan.n_windows)]
    return np.concatenate(ws) if ws else np.zeros(0, np.int64)


# ----------------------------------------------------------------------- any record lengths


@settings(max_examples=40, deadline=None)
@given(index=indexes(), strategy=st.sampled_from(["none", "block", "corgipile"]), block_size=st.integers(64, 2048),
       buffer=buffers, seed=st.integers(0, 2**32), epoch=st.integers(0, 3), world=st.integers(1, 5),
       parts=st.integers(1, 3))
def test_block_plans_from_the_summary_equal_those_from_the_index(index, strategy, block_size, buffer, seed, epoch,
                                                                world, parts):
    index = index.body()  # a summary is of the blocks a strategy plans: a torn last line apart
    summary = BlockSummary.of(index, block_size)
    assert summary.n == index.n and summary.data_bytes == index.data_bytes
    firsts = index.unit_firsts(block_size)
    assert np.array_equal(summary.unit_firsts(block_size), firsts)
    assert np.array_equal(summary.unit_bytes(firsts), index.unit_bytes(firsts))
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=block_size, buffer=buffer)
    for rank in range(world):
        for part in range(parts):
            a = make_plan(summary, spec, epoch, rank, world, part, parts)
            b = make_plan(index, spec, epoch, rank, world, part, parts)
            if world * parts == 1:
                assert_same_plan(a, b)
            else:  # shares cut inside a block: a summary estimates that block's bytes, so the
                # windows may be cut elsewhere, but the share holds the same records
                assert np.array_equal(np.sort(order(a)), np.sort(order(b)))
                assert np.array_equal(getattr(a, "inner", a).rank_counts, getattr(b, "inner", b).rank_counts)


@settings(max_examples=25, deadline=None)
@given(index=indexes(), block_size=st.integers(64, 2048), buffer=buffers, seed=st.integers(0, 2**32),
       epoch=st.integers(0, 3), world=st.integers(1, 5), exchange=st.floats(0.0, 1.0))
def test_pls_partitions_from_the_summary_equal_those_from_the_index(index, block_size, buffer, seed, epoch, world,
                                                                   exchange):
    """The partition and its uniform shuffle need blocks only; the windows are cut by record lengths,
    which a summary knows only for its own layout (next test)."""
    index = index.body()  # a summary is of the blocks a strategy plans: a torn last line apart
    summary = BlockSummary.of(index, block_size)
    spec = ShuffleSpec(strategy="pls", seed=seed, block_size=block_size, buffer=buffer, exchange=exchange)
    for rank in range(world):
        a, b = make_plan(summary, spec, epoch, rank, world), make_plan(index, spec, epoch, rank, world)
        assert np.array_equal(order(a), order(b))
        assert np.array_equal(a.rank_counts, b.rank_counts)


# ----------------------------------------------------------------------- the summary's own layout


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 3000), block_size=st.sampled_from([256, 1000, 4096]), record_bytes=st.integers(4, 200),
       spread=st.floats(0.0, 0.9), data_seed=st.integers(0, 2**16),
       strategy=st.sampled_from(["none", "block", "corgipile", "pls", "full", "once", "window"]),
       pls_local=st.sampled_from(["uniform", "corgipile"]), exchange=st.floats(0.0, 1.0),
       buffer=buffers, seed=st.integers(0, 2**32), epoch=st.integers(0, 3), world=st.integers(1, 4),
       even=st.sampled_from(["none", "pad", "drop"]))
def test_every_plan_of_a_synthetic_layout_equals_the_plan_of_its_index(n, block_size, record_bytes, spread, data_seed,
                                                                       strategy, pls_local, exchange, buffer, seed,
                                                                       epoch, world, even):
    """Record-level plans (and the even modes' cut windows) need record lengths: exact for this layout."""
    try:
        summary = BlockSummary.synthetic(n, block_size, record_bytes, spread, data_seed)
    except ValueError:
        return  # more blocks than records, or more records than a block can start
    index = summary.to_index()
    assert index.n == n == summary.n and index.data_bytes == summary.data_bytes
    assert np.array_equal(index.unit_firsts(block_size), summary.unit_firsts(block_size))
    assert np.array_equal(summary.bounds[np.arange(n + 1)], index.bounds)
    if n:
        ids = np.arange(n)
        assert np.array_equal(summary.out_lengths(ids), index.out_lengths(ids))
        assert summary.block_records.max() - summary.block_records.min() <= 2 * spread * n / (summary.blocks * (1 - spread)) + 2
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=block_size, buffer=buffer, exchange=exchange,
                       pls_local=pls_local, even=even if n else "none")
    for rank in range(world):
        assert_same_plan(make_plan(summary, spec, epoch, rank, world), make_plan(index, spec, epoch, rank, world))


@settings(max_examples=20, deadline=None)
@given(index=indexes(), block_size=st.integers(64, 2048))
def test_a_summary_of_an_index_keeps_block_starts_and_newlines(index, block_size):
    summary = BlockSummary.of(index, block_size)
    firsts = summary.unit_firsts(block_size)
    assert np.array_equal(summary.record_starts(firsts), index.bounds[firsts])
    assert np.array_equal(summary.newline_ids, index.newline_ids)
    if index.n:
        ids = np.arange(index.n)
        # the layout splits each block's bytes evenly: lengths differ, block totals do not
        lengths = summary.out_lengths(ids)
        assert np.array_equal(np.add.reduceat(lengths, firsts[:-1]), summary.unit_bytes(firsts))
        assert lengths.sum() == index.out_lengths(ids).sum() == index.data_bytes


# ----------------------------------------------------------------------- refusals and size


def test_other_unit_sizes_are_refused():
    summary = BlockSummary.synthetic(5000, block_size=4096, record_bytes=100)
    with pytest.raises(ValueError, match="4096 bytes only"):
        summary.unit_firsts(8192)
    with pytest.raises(ValueError, match="block summary"):
        make_plan(summary, ShuffleSpec(strategy="corgipile", block_size=8192), 0)
    with pytest.raises(ValueError, match="block summary"):
        make_plan(summary, ShuffleSpec(strategy="lirs-page", block_size=4096, page_size=512), 0)
    with pytest.raises(TypeError):
        summary.bounds[:10]
    with pytest.raises(IndexError):
        summary.record_lengths(np.array([5000]))


@pytest.mark.parametrize("recs, nbytes", [([1, 0], [5, 5]), ([1, 2], [5]), ([2, 1], [5, -1]), ([[1]], [[1]])])
def test_inconsistent_blocks_are_refused(recs, nbytes):
    with pytest.raises(ValueError):
        BlockSummary(4096, np.array(recs), np.array(nbytes))


def test_a_billion_records_cost_per_block_memory_only():
    tracemalloc.start()
    try:
        summary = BlockSummary.synthetic(10**9)
        plan = make_plan(summary, ShuffleSpec(strategy="corgipile", block_size=4 << 20), 1, 3, 1024)
        ids = plan.window(plan.n_windows - 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary.n == 10**9 and summary.blocks == len(summary.unit_firsts(4 << 20)) - 1
    assert summary.data_bytes == summary.block_bytes.sum()
    assert ids.dtype == np.int32 and 0 < len(ids) and ids.max() < 10**9
    assert peak < 64 << 20  # a record table alone would take 8 GB


# ----------------------------------------------------------------------- tools/scale.py


def load_scale():
    spec = importlib.util.spec_from_file_location("scale_tool", REPO / "tools" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


TINY = ["--records", "20000", "--world", "8", "--block-size", "4096", "--buffer", "16KiB", "--record-bytes", "100",
        "--sample", "3", "--scale-sample", "2", "--scale-records", "1e4,4e4", "--scale-blocks", "8KiB,4KiB",
        "--scale-worlds", "4,16", "--record-level", "5000"]


def test_scale_tool_runs_and_its_coverage_check_passes(capsys):
    assert load_scale().main(TINY + ["--strategies", "corgipile,block,none,pls"]) == 0
    out = capsys.readouterr().out
    assert "check passed" in out and "FAILED" not in out
    assert out.count("disjoint, cover all") == 4
    for heading in ("(a)", "(b)", "(c)", "record-level"):
        assert heading in out


def test_scale_tool_coverage_check_sees_a_block_given_twice():
    scale = load_scale()
    data = BlockSummary.synthetic(20000, 4096, 100)
    m = scale.measure(data, ShuffleSpec(strategy="block", block_size=4096, buffer=16384), 1, 4, np.arange(4), check=True)
    assert scale.cover_problems(m, data.blocks, data.n, 4) == []
    m.shares[0] = m.shares[1]
    assert any("more than one" in p for p in scale.cover_problems(m, data.blocks, data.n, 4))


def test_scale_tool_refuses_record_level_strategies():
    with pytest.raises(SystemExit):
        load_scale().main(["--strategies", "full"])
