"""Level: mounted (real FUSE mounts, real readers).

An open of a Parquet view whose stage is still being written is answered at once, and its reads
are served from the stage as far as it is written; opens while such a handle is open are served
so too (the kernel refuses to pass an inode through while it caches it), and once they are all
closed the next open is passed through again.  Every way yields the bytes of a mount without
passthrough."""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from conftest import REPO  # noqa: E402

ARGS = ("--seed", "9", "--buffer", "2MiB", "--stage-wait", "0")
NAMES = ("a.parquet", "b.parquet")


@pytest.fixture(scope="module")
def both(module_mount, tmp_path_factory):
    """(a mount that uses passthrough, one that does not) over two label-sorted files of 35 MB."""
    src = tmp_path_factory.mktemp("earlysrc")
    pf.label_sorted(src / NAMES[0])
    pf.label_sorted(src / NAMES[1], seed=8)
    staged = module_mount(None, *ARGS, src=src, name="staged")
    if not staged.stats()["passthrough"]["on"]:
        pytest.skip(f"no FUSE passthrough here: {staged.stats()['passthrough'].get('why_not')}")
    return staged, module_mount(None, *ARGS, "--passthrough", "off", src=src, name="served")


def set_epoch(both, epoch: int) -> None:
    """Every file's epoch at once: two files read together get no stage made when it is set."""
    for m in both:
        m.set_epoch(epoch)


def counts(m) -> tuple[int, int]:
    got = m.stats()["passthrough"]
    return got["early_opens"], got["opens"]


def pieces(path: Path, size: int) -> bytes:
    """The file read back to front in ``size`` pieces (the footer first, as readers do)."""
    with open(path, "rb") as f:
        offsets = range(0, os.fstat(f.fileno()).st_size, size)
        got = {off: os.pread(f.fileno(), size, off) for off in reversed(offsets)}
        return b"".join(got[off] for off in offsets)


def test_an_open_before_its_stage_is_written_reads_what_the_stage_will_hold(both):
    """Holds: SEMANTICS.md#views-parquet-early"""
    staged, served = both
    early_before, _ = counts(staged)
    for epoch in (60, 61, 62):
        set_epoch(both, epoch)
        for i, name in enumerate(NAMES):
            want = served.path(name).read_bytes()
            got = pieces(staged.path(name), 100_003) if i else staged.path(name).read_bytes()
            assert got == want, (epoch, name)
            with open(staged.path(name), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                assert m[:] == want
            assert pq.read_table(staged.path(name)).equals(pq.read_table(served.path(name)))
    early, _ = counts(staged)
    assert early > early_before  # an epoch's first open of a file found its stage being written


def test_opens_while_one_reads_a_stage_being_written_are_served_alike_then_passed_through(both):
    """Holds: SEMANTICS.md#views-parquet-early"""
    staged, served = both
    for epoch in range(70, 76):
        set_epoch(both, epoch)
        name = NAMES[0]
        want = served.path(name).read_bytes()
        early0, opens0 = counts(staged)
        first = open(staged.path(name), "rb")
        try:
            early1, _ = counts(staged)
            if early1 == early0:
                continue  # its stage was done before the open looked: try the next epoch
            head = first.read(1 << 20)
            with open(staged.path(name), "rb") as second:  # not ETXTBSY: served as the first is
                assert second.read() == want
            assert counts(staged) == (early1 + 1, opens0)
            assert head + first.read() == want
        finally:
            first.close()
        with open(staged.path(name), "rb") as third:  # none left: passed through
            assert third.read() == want
        assert counts(staged) == (early1 + 1, opens0 + 1)
        return
    pytest.fail("no open found its stage being written in 6 epochs")


def test_many_readers_of_a_stage_being_written_read_the_same(both):
    """Holds: SEMANTICS.md#views-parquet-early, SEMANTICS.md#views-parquet-passthrough"""
    staged, served = both
    set_epoch(both, 80)
    want = {name: served.path(name).read_bytes() for name in NAMES}
    got: dict[tuple[str, int], bytes] = {}

    def read(name: str, k: int) -> None:
        got[name, k] = pieces(staged.path(name), 65_536 * (k + 1)) if k % 2 else staged.path(name).read_bytes()

    threads = [threading.Thread(target=read, args=(name, k)) for name in NAMES for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got) == len(threads)
    assert all(data == want[name] for (name, _), data in got.items())


def test_a_source_rewritten_while_its_stage_is_read_as_written_gives_old_bytes_or_eio(mount, tmp_path):
    """The stage of a first epoch fills the file's decoded copy from the source as it goes; a
    source rewritten meanwhile fails the stage, and the reads past its written part fail with EIO:
    a handle reads the view of the version it opened, or an error, never other bytes.  Holds:
    SEMANTICS.md#views-parquet-early, SEMANTICS.md#errors-eio"""
    src = tmp_path / "src"
    src.mkdir()
    pf.label_sorted(src / "x.parquet", n=120_000, group_rows=10_000)
    served = mount(None, *ARGS, "--passthrough", "off", src=src, name="served")
    want = served.path("x.parquet").read_bytes()
    staged = mount(None, *ARGS, "--stage-wait", "0", src=src, name="staged")
    if not staged.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here")
    with open(staged.path("x.parquet"), "rb") as f:
        head = f.read(1 << 16)
        new = tmp_path / "new.parquet"
        pf.label_sorted(new, n=120_000, group_rows=10_000, seed=77)
        os.replace(new, src / "x.parquet")
        try:
            rest = f.read()
        except OSError as e:
            assert e.errno == errno.EIO, e
        else:
            assert head + rest == want
    assert counts(staged)[0] >= 1
    old = json.loads(staged.xattr("info", "x.parquet"))  # a new lookup: the new version
    assert old["records"] == 120_000


def test_a_killed_daemon_while_a_stage_is_read_as_written_leaves_no_stage(mount, tmp_path):
    """Holds: SEMANTICS.md#views-parquet-early"""
    src = tmp_path / "src"
    src.mkdir()
    pf.label_sorted(src / "x.parquet", n=120_000, group_rows=10_000)
    m = mount(None, *ARGS, src=src)
    if not m.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here")
    fd = os.open(m.path("x.parquet"), os.O_RDONLY)
    try:
        os.pread(fd, 1 << 16, 0)
        os.kill(m.pid, signal.SIGKILL)
        m.wait()
        with pytest.raises(OSError) as e:
            while os.read(fd, 1 << 20):  # pages the kernel holds may come first; then the daemon is gone
                pass
        assert e.value.errno == errno.ENOTCONN
    finally:
        try:
            os.close(fd)
        except OSError as e:
            assert e.errno == errno.ENOTCONN
    subprocess.run([sys.executable, "-m", "shufflefs", "umount", str(m.mnt)], capture_output=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    left = [p for p in Path(m.cache).rglob("*") if p.is_file() and "stage" in p.name]
    assert not left, left
