"""Level: mounted (real FUSE mounts, real readers).

A later mount of a root starts, at once, the stage of the file the mount before it read first,
at its own epoch, so a job that spends its start-up before the first read finds the stage ready;
and it builds ahead in the order that mount read its files.  A kept order that is damaged, or
names files that are not there, starts nothing and stops nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from conftest import wait_for  # noqa: E402

from shufflefs.stages.read_orders import ORDERS_DIR, order_file  # noqa: E402

ARGS = ("--seed", "3", "--buffer", "2MiB")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return pf.two_files(tmp_path / "pqsrc")


def made(m, name: str) -> str:
    return json.loads(m.xattr("info", name))["parquet"]["stage"]["made"]


def built(m) -> int:
    return m.stats()["passthrough"]["stages_built"]


def read_one(mount, src: Path, name: str) -> Path:
    """The cache directory of a mount that read ``name`` alone, then was unmounted."""
    m = mount(None, *ARGS, src=src, name="first")
    if not m.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here: no stages")
    assert pq.read_table(m.path(name)).num_rows == pq.read_table(src / name).num_rows
    wait_for(lambda: not m.stats()["passthrough"].get("building_ahead"), "the build ahead to end")
    m.stop()
    assert m.returncode == 0, m.stderr()
    return m.cache


def test_a_later_mount_stages_the_file_the_mount_before_read_first_before_its_first_open(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-mount-start"""
    cache = read_one(mount, src, "sorted.parquet")
    orders = list((cache / ORDERS_DIR).iterdir())
    assert len(orders) == 1 and json.loads(orders[0].read_text())["files"] == [["sorted.parquet", 0, 1]]
    later = mount(None, *ARGS, "--cache-dir", str(cache), "--epoch", "7", src=src, name="later")
    wait_for(lambda: built(later) >= 1, "the stage built at the mount's start, no file opened")
    assert later.stats()["passthrough"]["opens"] == 0
    served = mount(None, *ARGS, "--passthrough", "off", "--epoch", "7", src=src, name="served")
    for name in pf.TWO_FILES:
        assert later.path(name).read_bytes() == served.path(name).read_bytes()
    assert made(later, "sorted.parquet").startswith("when the mount started"), made(later, "sorted.parquet")
    assert made(later, "types.parquet") == "at its first open"  # not read by the mount before
    assert later.stats()["passthrough"]["early_opens"] == 0


def test_a_mount_with_no_order_kept_starts_no_stage(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-mount-start"""
    m = mount(None, *ARGS, src=src)
    if not m.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here: no stages")
    time.sleep(1.0)
    assert built(m) == 0
    m.stop()
    assert not (m.cache / ORDERS_DIR).exists()  # nothing read: nothing kept


@pytest.mark.parametrize("order", ["garbage", "outside", "gone", "fifo", "huge"])
def test_a_damaged_or_stale_order_starts_nothing_and_the_mount_serves_as_ever(mount, src: Path, order: str):
    """Holds: SEMANTICS.md#views-parquet-mount-start"""
    cache = read_one(mount, src, "sorted.parquet")
    path = Path(order_file(str(cache / ORDERS_DIR), str(src)))
    path.unlink()
    if order == "fifo":
        os.mkfifo(path)
    else:
        files = {"garbage": None, "outside": [["../pqsrc/sorted.parquet", 0, 1]], "gone": [["gone.parquet", 0, 1]],
                 "huge": [["sorted.parquet", 0, 1]] * 400_000}[order]
        path.write_text("{not json" if files is None else json.dumps({"v": 1, "source": str(src), "files": files}))
    later = mount(None, *ARGS, "--cache-dir", str(cache), "--epoch", "7", src=src, name="later")
    time.sleep(1.0)
    assert built(later) == 0
    served = mount(None, *ARGS, "--passthrough", "off", "--epoch", "7", src=src, name="served")
    assert later.path("sorted.parquet").read_bytes() == served.path("sorted.parquet").read_bytes()
    assert made(later, "sorted.parquet") == "at its first open"
    later.stop()
    assert later.returncode == 0, later.stderr()
    assert json.loads(path.read_text())["files"] == [["sorted.parquet", 0, 1]]  # this mount's own, whole


def test_a_later_mount_builds_ahead_in_the_order_the_mount_before_read_its_files(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-mount-start"""
    first = mount(None, *ARGS, src=src, name="first")
    if not first.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here: no stages")
    for name in pf.TWO_FILES:  # types, then sorted: no epoch before, so nothing built ahead for sorted
        first.path(name).read_bytes()
    wait_for(lambda: not first.stats()["passthrough"].get("building_ahead"), "the build ahead to end")
    first.stop()
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), "--epoch", "9", src=src, name="later")
    served = mount(None, *ARGS, "--passthrough", "off", "--epoch", "9", src=src, name="served")
    wait_for(lambda: built(later) >= 1, "the stage of the file read first, built at the mount's start")
    a, b = pf.TWO_FILES
    assert later.path(a).read_bytes() == served.path(a).read_bytes()
    wait_for(lambda: later.stats()["passthrough"]["staged_ahead"] >= 1
             and not later.stats()["passthrough"]["building_ahead"], "the next file's stage, built ahead")
    assert later.path(b).read_bytes() == served.path(b).read_bytes()
    assert made(later, a).startswith("when the mount started"), made(later, a)
    assert made(later, b) == "while the file before was read", made(later, b)
