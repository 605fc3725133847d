"""Level: pure (no mount, no daemon).

Stage files (``--stage-dir``) below the FUSE layer: real files on disk, read back through the
same window builder the mount uses."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.errors import StageError, StaleSourceError
from shufflefs.formats import make_format
from shufflefs.index.table import RecordIndex, SourceStamp
from shufflefs.windows.layout import render
from shufflefs.index.joined_index import PooledIndex
from shufflefs.stages.stage_file import StageCancelled, StagedSource, StageMap, run_ids, write_stage
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.partial_local import pls_exchange
from shufflefs.sources.local import SourceFile
from shufflefs.sources.pool import PoolSource
from shufflefs.windows.view import View, _build_window

pytestmark = pytest.mark.skipif(_build_window is None, reason="staging needs the compiled gather module")
FMT = make_format("lines", {})


def write_lines(path, n: int, seed: int, last_newline: bool = True) -> RecordIndex:
    rnd = np.random.default_rng(seed)
    body = b"".join(b'{"i": %d, "pad": "%s"}\n' % (i, b"x" * int(rnd.integers(0, 200))) for i in range(n))
    if not last_newline:
        body = body[:-1]
    path.write_bytes(body)
    index = FMT.scan(np.frombuffer(body, np.uint8), str(path))
    return dataclasses.replace(index, stamp=SourceStamp.of(os.stat(path)))


def record_bytes(data: bytes, index: RecordIndex, ids) -> bytes:
    b = index.bounds
    return b"".join(data[b[i]: b[i + 1]] for i in np.sort(ids).tolist())


class Meter:
    def __init__(self) -> None:
        self.source = self.stage = 0

    def __call__(self, source: int, stage: int, fetched: object = None) -> None:
        self.source += source
        self.stage += stage


class Undescribed(SourceFile):
    """A source without descriptors, as an object store's is: runs come from `read_runs`."""

    def place(self, index, first, count):
        return None


@settings(max_examples=200, deadline=None)
@given(held=st.sets(st.integers(0, 200)), asked=st.sets(st.integers(0, 200), min_size=1))
def test_split_cuts_asked_ids_into_runs_inside_one_stage_run_or_outside(held, asked):
    bounds = np.arange(202, dtype=np.int64) * 3
    smap = StageMap.of(bounds, np.array(sorted(held), np.int64))
    first, count, run = smap.split(np.array(sorted(asked), np.int64))
    assert run_ids(first, count).tolist() == sorted(asked)
    for f, c, r in zip(first.tolist(), count.tolist(), run.tolist()):
        ids = set(range(f, f + c))
        if r < 0:
            assert not ids & held
        else:
            assert ids <= set(range(int(smap.first[r]), int(smap.first[r] + smap.count[r])))


@pytest.mark.parametrize("kind", [SourceFile, Undescribed])
def test_a_stage_holds_the_records_ascending_and_the_next_one_reads_only_new_records_from_the_source(tmp_path, kind):
    src = tmp_path / "a.jsonl"
    index = write_lines(src, 500, 1, last_newline=False)
    data = src.read_bytes()
    rnd = np.random.default_rng(5)
    first_ids = rnd.choice(index.n, 300, replace=False)
    kept = rnd.choice(first_ids, 200, replace=False)
    new = rnd.choice(np.setdiff1d(np.arange(index.n), first_ids), 100, replace=False)
    second_ids = np.concatenate((kept, new))
    source = kind(str(src), index.stamp)
    try:
        m0, m1 = Meter(), Meter()
        s0 = write_stage(str(tmp_path / "s0"), "a.jsonl", 0, index, first_ids, source, meter=m0)
        s1 = write_stage(str(tmp_path / "s1"), "a.jsonl", 1, index, second_ids, source, previous=s0, meter=m1)
        assert (tmp_path / "s0").read_bytes() == record_bytes(data, index, first_ids)
        assert (tmp_path / "s1").read_bytes() == record_bytes(data, index, second_ids)
        assert (m0.source, m0.stage) == (len(record_bytes(data, index, first_ids)), 0)
        assert m1.source == len(record_bytes(data, index, new))
        assert m1.stage == len(record_bytes(data, index, kept))
        assert s1.records == 300 and s1.nbytes == os.path.getsize(tmp_path / "s1")
        s0.drop()
        assert not (tmp_path / "s0").exists()
    finally:
        source.close()


@pytest.mark.parametrize("local", ["uniform", "corgipile"])
def test_staged_windows_equal_the_sources_and_read_nothing_from_it(tmp_path, local):
    src = tmp_path / "a.jsonl"
    index = write_lines(src, 3000, 2, last_newline=False)
    spec = ShuffleSpec(strategy="pls", block_size=16 << 10, buffer=64 << 10, exchange=0.3, pls_local=local, seed=3)
    exchange = pls_exchange(index.body(), spec, 3)  # as plans: the torn last line apart
    previous = None
    for epoch in range(3):
        plan = make_plan(index, spec, epoch, rank=1, world=3)
        ids = exchange.partition(1, epoch)
        source = SourceFile(str(src), index.stamp)
        meter = Meter()
        stage = write_stage(str(tmp_path / f"s{epoch}"), "a.jsonl", epoch, index, ids, source, previous, meter=meter)
        if previous is not None:
            received = np.setdiff1d(ids, exchange.partition(1, epoch - 1))
            assert meter.source == int(index.record_lengths(received).sum())
            assert len(received) == exchange.counts(1, epoch)["received"]
            previous.drop()
        reads = Meter()
        view = View(str(src), index, plan, StagedSource(source, stage, lambda: None), meter=reads)
        try:
            got = b"".join(view.load_window(k)[0].tobytes() for k in range(plan.n_windows))
        finally:
            view.close()
        assert got == render(index, plan, src.read_bytes())
        assert reads.source == 0 and reads.stage == int(index.record_lengths(ids).sum())
        previous = stage
    previous.drop()


def test_a_pool_stages_across_members(tmp_path):
    members = [write_lines(tmp_path / f"p{i}.jsonl", 200 + 50 * i, 10 + i, last_newline=i != 1) for i in range(3)]
    paths = [str(tmp_path / f"p{i}.jsonl") for i in range(3)]
    pool = PooledIndex(members).torn_last()
    spec = ShuffleSpec(strategy="pls", block_size=4 << 10, exchange=0.5, seed=1)
    plan = make_plan(pool, spec, 1, rank=0, world=2)
    ids = pls_exchange(pool.body(), spec, 2).partition(0, 1)
    source = PoolSource(paths, pool, SourceFile)
    stage = write_stage(str(tmp_path / "s"), "p", 1, pool, ids, source)
    staged = View(paths[0], pool, plan, StagedSource(source.share(), stage, stage.drop), frame=(b"", b""))
    plain = View(paths[0], pool, plan, source.share(), frame=(b"", b""))
    try:
        for k in range(plan.n_windows):
            assert staged.load_window(k)[0].tobytes() == plain.load_window(k)[0].tobytes()
    finally:
        staged.close()
        plain.close()
        source.close()
    assert not (tmp_path / "s").exists()


def test_a_changed_source_or_stage_is_an_error_not_bytes(tmp_path):
    src = tmp_path / "a.jsonl"
    index = write_lines(src, 400, 4)
    spec = ShuffleSpec(strategy="pls", block_size=4 << 10, exchange=0.5)
    plan = make_plan(index, spec, 0, rank=0, world=2)
    source = SourceFile(str(src), index.stamp)
    stage = write_stage(str(tmp_path / "s"), "a.jsonl", 0, index, pls_exchange(index, spec, 2).partition(0, 0), source)
    view = View(str(src), index, plan, StagedSource(source, stage, stage.drop))
    try:
        view.load_window(0)
        os.truncate(tmp_path / "s", stage.nbytes - 10)
        with pytest.raises(StageError, match="stage file"):
            view.load_window(0)
        with open(src, "ab") as f:
            f.write(b'{"late": 1}\n')
        with pytest.raises(StaleSourceError):
            view.load_window(0)
    finally:
        view.close()
    assert not (tmp_path / "s").exists()


def test_a_stopped_build_leaves_no_file(tmp_path):
    src = tmp_path / "a.jsonl"
    index = write_lines(src, 100, 6)
    stop = threading.Event()
    stop.set()
    source = SourceFile(str(src), index.stamp)
    try:
        with pytest.raises(StageCancelled):
            write_stage(str(tmp_path / "s"), "a.jsonl", 0, index, np.arange(100), source, stop=stop)
        with pytest.raises(StageError, match="cannot create"):
            write_stage(str(tmp_path / "no" / "s"), "a.jsonl", 0, index, np.arange(100), source)
    finally:
        source.close()
    assert os.listdir(tmp_path) == ["a.jsonl"]
