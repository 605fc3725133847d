"""Level: mounted (real FUSE mounts, real readers).

Numbered Parquet shards (``train-00000-of-00003.parquet``, as the Hub publishes datasets) are
shuffled as one pool: each output shard is a Parquet file with the shards' schema holding a share
of the pooled rows, the shards together every row once, each mixing rows of every member (a
dataset split into shards by label); rank shares of the pool hold every row once; a member
changed while mounted fails the handles opened before with ESTALE; members of different schemas
are EIO with the reason."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402

ARGS = ("--seed", "2", "--buffer", "2MiB")
SHARDS, PER = 3, 8_000
NAMES = [f"train-{i:05d}-of-{SHARDS:05d}.parquet" for i in range(SHARDS)]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pqpool")
    whole = pq.read_table(pf.label_sorted(d / "whole.parquet", n=SHARDS * PER, group_rows=2_000))
    (d / "src").mkdir()
    for i, name in enumerate(NAMES):  # shard i holds labels 10i/3 .. : a dataset exported in label order
        pq.write_table(whole.slice(i * PER, PER), d / "src" / name, row_group_size=2_000)
    return d / "src"


def shard_ids(m, epoch: int | None = None) -> list[list[int]]:
    if epoch is not None:
        m.set_epoch(epoch)
    return [pq.read_table(m.path(name)).column("id").to_pylist() for name in NAMES]


def test_shards_are_one_pool_of_rows(mount, src):
    """Holds: SEMANTICS.md#ranks-pools, SEMANTICS.md#views-parquet-copy"""
    m = mount(None, *ARGS, src=src)
    schema = pq.read_schema(src / NAMES[0])
    first = shard_ids(m)
    assert sorted(sum(first, [])) == list(range(SHARDS * PER))
    for name in NAMES:
        table = pq.read_table(m.path(name))
        assert table.schema.equals(schema, check_metadata=True)
        assert len(set(table.column("label").to_pylist())) == 10  # rows of every member
    info = json.loads(m.xattr("info", NAMES[0]))
    assert info["pool_shards"] == SHARDS and info["parquet"]["copy"]["row_groups"] == SHARDS * PER // 2_000
    again = shard_ids(m, 1)
    assert again != first and sorted(sum(again, [])) == list(range(SHARDS * PER))
    assert shard_ids(m, 0) == first


def test_ranks_split_the_pool(mount, src):
    """Holds: SEMANTICS.md#ranks-share, SEMANTICS.md#ranks-pools"""
    ranks = [mount(None, *ARGS, "--rank", str(r), "--world-size", "2", src=src, name="r") for r in range(2)]
    got = [sum(shard_ids(m), []) for m in ranks]
    assert not set(got[0]) & set(got[1]) and sorted(got[0] + got[1]) == list(range(SHARDS * PER))
    assert abs(len(got[0]) - len(got[1])) <= 1


def test_a_member_changed_while_mounted(mount, src, tmp_path):
    """Served by the daemon (a stage read by the kernel is the old version's view whole:
    test_parquet_changes).  Holds: SEMANTICS.md#changes-pool"""
    d = tmp_path / "src"
    d.mkdir()
    for name in NAMES:
        (d / name).write_bytes((src / name).read_bytes())
    m = mount(None, *ARGS, "--passthrough", "off", src=d)
    path = m.path(NAMES[0])
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.pread(fd, 4, 0)
        table = pq.read_table(d / NAMES[2])
        pq.write_table(table.slice(0, 5_000), tmp_path / "new.parquet", row_group_size=2_000)
        os.replace(tmp_path / "new.parquet", d / NAMES[2])
        with pytest.raises(OSError) as e:
            os.pread(fd, 1 << 16, size // 2)
        assert e.value.errno == errno.ESTALE
    finally:
        os.close(fd)
    assert len(sum(shard_ids(m), [])) == 2 * PER + 5_000


def test_members_of_another_schema_are_eio_with_the_reason(mount, src, tmp_path):
    """Holds: SEMANTICS.md#errors-eio, SEMANTICS.md#views-parquet-copy"""
    d = tmp_path / "src"
    d.mkdir()
    for name in NAMES[:2]:
        (d / name).write_bytes((src / name).read_bytes())
    other = pq.read_table(src / NAMES[2]).drop_columns(["tags"])
    pq.write_table(other, d / NAMES[2], row_group_size=2_000)
    m = mount(None, *ARGS, src=d)
    with pytest.raises(OSError) as e:
        pq.read_table(m.path(NAMES[0]))
    assert e.value.errno == errno.EIO
    line = m.xattr("error", NAMES[0])
    assert "pool member 2 has another schema" in line, line
    assert str(d / NAMES[2]) in line and str(d / NAMES[0]) in line, line  # both files named


def test_a_member_that_is_not_parquet_is_eio_naming_it_not_an_internal_error(mount, src, tmp_path):
    """A member's own error, raised among the members' indexes built at once, reaches the reader
    and the log as itself (it was logged as an internal error with a traceback).
    Holds: SEMANTICS.md#errors-eio"""
    d = tmp_path / "src"
    d.mkdir()
    for name in NAMES[:2]:
        (d / name).write_bytes((src / name).read_bytes())
    (d / NAMES[2]).write_text("id,tags\n1,a\n")
    m = mount(None, *ARGS, src=d)
    for name in NAMES:
        with pytest.raises(OSError) as e:
            pq.read_table(m.path(name))
        assert e.value.errno == errno.EIO
    line = m.xattr("error", NAMES[0])
    assert str(d / NAMES[2]) in line and "Parquet" in line, line
    assert "internal error" not in m.stderr() and "Traceback" not in m.stderr(), m.stderr()
