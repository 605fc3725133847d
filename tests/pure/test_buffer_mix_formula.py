"""Level: pure (no mount).

The expected label mix of a buffer of single-label blocks (`quality.expected_block_mix_tv`)
against a numpy simulation and the exact binomial sum; blocks per buffer as plans take them; the
``stat`` line of a file whose buffer holds few blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflefs.cli.stat import format_stats
from shufflefs.quality.metrics import expected_block_mix_tv
from shufflefs.strategies import make_plan
from shufflefs.strategies.base import MIX_ASSUMPTION, ShuffleSpec, blocks_per_buffer, buffer_label_mix

KiB, MiB = 1 << 10, 1 << 20


def simulated(n: int, labels: int, draws: int = 200_000, seed: int = 0) -> float:
    """Mean TV between the label shares of n blocks of uniformly drawn labels and 1/L each."""
    counts = np.random.default_rng(seed).multinomial(n, [1.0 / labels] * labels, size=draws)
    return float((0.5 * np.abs(counts / n - 1.0 / labels).sum(axis=1)).mean())


def binomial_sum(n: int, labels: int) -> float:
    p, x = 1.0 / labels, np.arange(n + 1)
    logpmf = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                       + k * math.log(p) + (n - k) * math.log1p(-p) for k in range(n + 1)])
    return 0.5 * labels * float(np.dot(np.exp(logpmf), np.abs(x / n - p)))


@pytest.mark.parametrize("n,labels", [(1, 10), (4, 10), (16, 10), (64, 10), (256, 10), (16, 2), (30, 4), (100, 3)])
def test_the_formula_matches_a_simulation(n, labels):
    want = simulated(n, labels)
    got = expected_block_mix_tv(n, labels)
    assert got == pytest.approx(want, abs=0.003)
    assert got == pytest.approx(binomial_sum(n, labels), rel=1e-9)


def test_known_values_and_the_large_buffer_approximation():
    assert expected_block_mix_tv(1, 10) == pytest.approx(0.9)  # one block: one label
    assert expected_block_mix_tv(16, 10) == pytest.approx(0.3088, abs=1e-4)
    assert expected_block_mix_tv(50, 1) == 0.0
    for n in (1000, 10_000, 1 << 20):
        assert expected_block_mix_tv(n, 10) == pytest.approx(math.sqrt(9 / (2 * math.pi * n)), rel=0.02)
    mixes = [expected_block_mix_tv(n, 10) for n in (8, 16, 32, 64, 128, 256)]
    assert mixes == sorted(mixes, reverse=True)
    with pytest.raises(ValueError):
        expected_block_mix_tv(0, 10)


def test_blocks_per_buffer_is_what_the_plan_takes():
    from shufflefs.index.table import RecordIndex

    bounds = np.arange(0, 4 * MiB + 1, 64, dtype=np.int64)
    index = RecordIndex(int(bounds[-1]), bounds)
    spec = ShuffleSpec(strategy="corgipile", block_size=64 * KiB, buffer=MiB)
    assert blocks_per_buffer(spec, 4 * MiB) == 16
    assert blocks_per_buffer(ShuffleSpec(block_size=4 * KiB, buffer=MiB), 4 * MiB) == 256
    assert blocks_per_buffer(spec, 4 * MiB, parts=4) == 4
    assert blocks_per_buffer(ShuffleSpec(block_size=MiB, buffer=0.01), 4 * MiB) == 1
    assert buffer_label_mix(spec, 4 * MiB) == (16, pytest.approx(expected_block_mix_tv(16, 10)))
    assert buffer_label_mix(spec, MiB)[1] == 0.0  # one buffer holds the whole file
    for strategy in ("block", "corgipile"):
        plan = make_plan(index, ShuffleSpec(strategy=strategy, block_size=64 * KiB, buffer=MiB), 0, 0, 1)
        assert plan.blocks_per_window == 16
    auto = ShuffleSpec(buffer=0.1)  # automatic blocks (1/64 of the file), a tenth of it per buffer
    assert make_plan(index, auto, 0, 0, 1).blocks_per_window == blocks_per_buffer(auto, index.data_bytes) == 6


def test_stat_names_a_file_whose_buffer_holds_few_blocks():
    out = format_stats({"mountpoint": "/m", "strategy": "corgipile",
                        "small_buffers": {"a.jsonl": {"blocks_per_buffer": 16, "expected_label_mix": 0.309}}})
    line = next(x for x in out.splitlines() if x.startswith("small buffer"))
    assert "a.jsonl: 16 blocks per buffer, expected label mix 0.309" in line
    assert MIX_ASSUMPTION in line and "--block-size smaller or --buffer larger" in line


def test_a_files_buffer_is_checked_once_not_at_every_plan(monkeypatch, caplog):
    """Every plan of a file (each epoch, each shard of a pool) notes it: the expected mix was
    computed each time (3-6 ms for a pool of 2 M rows) though the answer cannot change."""
    from shufflefs.index.table import RecordIndex
    from shufflefs.serve import plan_notes

    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return buffer_label_mix(*args, **kwargs)

    monkeypatch.setattr(plan_notes, "buffer_label_mix", counted)
    index = RecordIndex(64 * MiB, np.arange(0, 64 * MiB + 1, 64, dtype=np.int64))
    wide = plan_notes.PlanNotes(ShuffleSpec(strategy="corgipile", block_size=4 * KiB, buffer=MiB))
    for _ in range(3):  # 256 blocks per buffer: nothing to say, asked once
        wide.note("a.jsonl", index)
    assert len(calls) == 1 and wide.small_buffers == {}
    wide.note("a.jsonl", index, parts=16)  # the buffer split 16 ways: 16 blocks each, asked again
    assert len(calls) == 2 and wide.small_buffers["a.jsonl"]["blocks_per_buffer"] == 16
    narrow = plan_notes.PlanNotes(ShuffleSpec(strategy="corgipile", block_size=64 * KiB, buffer=MiB))
    caplog.clear()
    with caplog.at_level("WARNING", logger="shufflefs"):
        for _ in range(3):
            narrow.note("a.jsonl", index)
    assert len(calls) == 3 and narrow.small_buffers["a.jsonl"]["blocks_per_buffer"] == 16
    assert sum("a buffer holds 16 blocks" in r.getMessage() for r in caplog.records) == 1
