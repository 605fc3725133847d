"""Level: mounted (real FUSE mounts, real readers).

Parquet views read by the kernel from a stage file (FUSE passthrough, Linux 6.9+, a root daemon):
each view is encoded once per epoch into a file on local disk and every handle of it reads that
file.  They hold the bytes the daemon serves without passthrough, for every reader (mapped or
not); handles of two epochs open at once read their own; the next epoch's stage is built while
one is read; many readers at once read the same; a kill leaves no stage behind."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from conftest import REPO  # noqa: E402

ARGS = ("--seed", "5", "--buffer", "2MiB")
NAMES = ("types.parquet", "sorted.parquet")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ptsrc")
    pf.write_pyarrow(d / NAMES[0])
    pf.label_sorted(d / NAMES[1])
    return d


@pytest.fixture(scope="module")
def both(module_mount, src):
    """(a mount that uses passthrough, one that does not), over the same files and options."""
    staged = module_mount(None, *ARGS, src=src, name="staged")
    if not staged.stats()["passthrough"]["on"]:
        pytest.skip(f"no FUSE passthrough here: {staged.stats()['passthrough'].get('why_not')}")
    return staged, module_mount(None, *ARGS, "--passthrough", "off", src=src, name="served")


def set_epoch(both, epoch: int, name: str = "") -> None:
    for m in both:
        m.set_epoch(epoch, name)


def test_stages_hold_the_bytes_the_daemon_serves_for_every_reader(both, src):
    """Holds: SEMANTICS.md#views-parquet-passthrough, SEMANTICS.md#views-parquet"""
    staged, served = both
    for epoch in (0, 1):
        set_epoch(both, epoch)
        for name in NAMES:
            want = served.path(name).read_bytes()
            assert staged.path(name).read_bytes() == want
            mapped = np.memmap(staged.path(name), mode="r")
            assert mapped.tobytes() == want
            del mapped
            table = pq.read_table(staged.path(name))
            assert table.equals(pq.read_table(served.path(name)))
            assert table.schema.metadata == pq.read_table(src / name).schema.metadata
            rows = sum(b.num_rows for b in pq.ParquetFile(staged.path(name)).iter_batches())
            assert rows == table.num_rows
    got = staged.stats()["passthrough"]
    assert got["on"] and got["opens"] >= 8 and got["stages_built"] >= 4, got
    off = served.stats()["passthrough"]
    assert not off["on"] and off["why_not"] == "--passthrough off"
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(staged.path())], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO))).stdout
    assert "passthrough" in out and "read by the kernel" in out, out


def test_handles_of_two_epochs_read_their_own_stages(both):
    """Holds: SEMANTICS.md#views-parquet-passthrough, SEMANTICS.md#views-inode"""
    staged, served = both
    name = NAMES[1]
    set_epoch(both, 10)
    want10 = served.path(name).read_bytes()
    with open(staged.path(name), "rb") as old:
        first = old.read(len(want10) // 2)
        set_epoch(both, 11)
        want11 = served.path(name).read_bytes()
        with open(staged.path(name), "rb") as new:
            assert new.read() == want11
        assert first + old.read() == want10
    assert want10 != want11


def wait_ahead(mount, count: int) -> None:
    """Until ``count`` stages were built ahead in all and none is being built."""
    deadline = time.monotonic() + 60
    while True:
        got = mount.stats()["passthrough"]
        if got["staged_ahead"] >= count and not got["building_ahead"]:
            return
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def settled(mount) -> int:
    """Stages built ahead so far, once none is being built and the count held for 0.3 s (a build
    a test before asked for must not count as this test's)."""
    deadline = time.monotonic() + 60
    last = None
    while True:
        got = mount.stats()["passthrough"]
        now = (got["staged_ahead"], got["building_ahead"])
        if now == last and not now[1]:
            return now[0]
        assert time.monotonic() < deadline, got
        last = now
        time.sleep(0.3)


def test_the_next_epochs_stage_is_built_while_one_is_read(both):
    """Holds: SEMANTICS.md#views-parquet-passthrough"""
    staged, served = both
    name = NAMES[1]
    set_epoch(both, 19, name)  # an epoch that opened this file alone: whatever another test read
    with open(staged.path(name), "rb") as f:  # before on this mount, the next stage is its own
        f.read(4)
    set_epoch(both, 20, name)
    before = settled(staged)
    with open(staged.path(name), "rb") as f:
        f.read(4)
    wait_ahead(staged, before + 1)
    set_epoch(both, 21, name)
    assert staged.path(name).read_bytes() == served.path(name).read_bytes()
    made = json.loads(staged.xattr("info", name))["parquet"]["stage"]["made"]
    assert made == "while the epoch before was read", made
    set_epoch(both, 25, name)  # not the one built ahead: made when set, or at its open
    assert staged.path(name).read_bytes() == served.path(name).read_bytes()
    made = json.loads(staged.xattr("info", name))["parquet"]["stage"]["made"]
    assert made in ("when its epoch was set", "at its first open"), made


def test_a_stage_ahead_asked_for_while_another_is_built_is_built_after_it(both):
    """Holds: SEMANTICS.md#views-parquet-passthrough (an epoch opened while the stage ahead of
    the epoch before is still being built gets its own next stage: the request waits, it is not
    dropped)"""
    staged, served = both
    name = NAMES[1]
    before = staged.stats()["passthrough"]["staged_ahead"]
    for epoch in (30, 40, 50):  # each open asks for epoch + 1 at once, while the last is built
        set_epoch(both, epoch, name)
        with open(staged.path(name), "rb") as f:
            f.read(4)
    wait_ahead(staged, before + 1)
    set_epoch(both, 51, name)
    made = json.loads(staged.xattr("info", name))["parquet"]["stage"]["made"]
    assert made == "while the epoch before was read", made
    assert staged.path(name).read_bytes() == served.path(name).read_bytes()


def test_files_read_together_get_no_stage_ahead(both):
    """Of many files read in an epoch whose order is not known yet (no epoch before opened them),
    the next epoch's stage is built ahead for the first only: the others' would be dropped before
    their turn.  Holds: SEMANTICS.md#views-parquet-passthrough"""
    staged, _ = both
    set_epoch(both, 40)
    time.sleep(1)  # the epoch change's preparation (two files: no stages)
    wait_ahead(staged, 0)  # none still being built for an earlier test
    before = staged.stats()["passthrough"]
    for name in NAMES:
        staged.path(name).read_bytes()
    time.sleep(0.5)
    wait_ahead(staged, 0)
    after = staged.stats()["passthrough"]
    assert after["staged_ahead"] - before["staged_ahead"] <= 1, (before, after)
    assert after["stages_built"] - before["stages_built"] <= 3, (before, after)  # the two opened, one ahead


def test_shards_read_in_turn_find_the_next_ones_stage_built_while_one_is_read(both):
    """Files read one after the other every epoch (shards): once an epoch opened them all, the
    stage of the file opened next in it is built while one is read, and after the last one the
    first one's of the next epoch.  A reader that changes its order gets the right bytes
    all the same.  Holds: SEMANTICS.md#views-parquet-passthrough"""
    staged, served = both
    made = {}
    for epoch, names in ((60, NAMES), (61, NAMES), (62, NAMES), (63, NAMES[::-1])):
        set_epoch(both, epoch)
        for name in names:
            wait_ahead(staged, 0)  # whatever is built ahead is done: each label below is certain
            assert staged.path(name).read_bytes() == served.path(name).read_bytes(), (epoch, name)
            made[epoch, name] = json.loads(staged.xattr("info", name))["parquet"]["stage"]["made"]
    assert made[62, NAMES[0]] == "while the epoch before was read", made  # after the last file of 61
    assert made[62, NAMES[1]] == "while the file before was read", made
    assert made[63, NAMES[1]] != "while the file before was read", made  # not the file predicted


def test_a_shard_rewritten_or_removed_after_its_stage_was_built_ahead_is_never_served_old(mount, tmp_path):
    """A shard whose stage was built ahead (while the shards before it were read), then rewritten before its
    open: the open shows the new version (the stage built ahead is of the old one and is never
    read); a shard removed then is ENOENT, and the others read on.  Holds:
    SEMANTICS.md#views-parquet-passthrough, SEMANTICS.md#changes-new-open"""
    src = tmp_path / "shards"
    src.mkdir()
    names = [f"train-{k:05d}-of-00003.parquet" for k in range(3)]
    for k, name in enumerate(names):
        pf.label_sorted(src / name, n=6_000, group_rows=2_000, seed=40 + k)
    staged = mount(None, *ARGS, src=src, name="staged")
    if not staged.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here")
    for epoch in (0, 1):  # the second epoch learns nothing new: the order of the first is known
        staged.set_epoch(epoch)
        for name in names:
            wait_ahead(staged, 0)
            pq.read_table(staged.path(name))
    staged.set_epoch(2)
    wait_ahead(staged, 0)
    pq.read_table(staged.path(names[0]))  # the stage of names[2] is built meanwhile
    wait_ahead(staged, 0)
    made = json.loads(staged.xattr("info", names[1]))["parquet"]["stage"]["made"]
    assert made == "while the epoch before was read", made  # two ahead of the last shard of epoch 1
    pf.label_sorted(src / names[1], n=6_000, group_rows=2_000, seed=99)  # rewritten: the pool's version moves
    served = mount(None, *ARGS, "--passthrough", "off", src=src, name="served")
    served.set_epoch(2)
    for name in names[1:]:
        assert staged.path(name).read_bytes() == served.path(name).read_bytes(), name
    os.unlink(src / names[2])
    with pytest.raises(FileNotFoundError):
        staged.path(names[2]).read_bytes()


def test_many_readers_at_once_read_the_same(both):
    """Holds: SEMANTICS.md#views-parquet-passthrough"""
    staged, served = both
    name = NAMES[0]
    set_epoch(both, 30)
    want = served.path(name).read_bytes()
    got: list[bytes] = []

    def read() -> None:
        with open(staged.path(name), "rb") as f:
            got.append(f.read())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 8


def test_a_killed_daemon_leaves_no_stage(mount, src):
    """Stage files have no name: a SIGKILL leaves none on the disk, and handles open then keep
    reading what they read.  Holds: SEMANTICS.md#views-parquet-passthrough"""
    m = mount(None, *ARGS, src=src)
    if not m.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here")
    name = NAMES[1]
    want = m.path(name).read_bytes()
    fd = os.open(m.path(name), os.O_RDONLY)
    try:
        head = os.read(fd, 10)
        os.kill(m.pid, signal.SIGKILL)
        m.wait()
        rest = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))  # (fstat now fails: ENOTCONN)
        assert head + rest == want  # the kernel holds the stage for the handle
    finally:
        try:
            os.close(fd)
        except OSError as e:  # its flush goes to the dead daemon
            assert e.errno == errno.ENOTCONN
    subprocess.run([sys.executable, "-m", "shufflefs", "umount", str(m.mnt)], capture_output=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    left = [p for p in Path(m.cache).rglob("*") if p.is_file() and "stage" in p.name]
    assert not left, left
