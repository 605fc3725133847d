"""Level: mounted (real FUSE mounts, real readers).

Stages kept whole from one mount to the next: a Parquet view's stage file left at unmount is
named by what it holds (the source's version, the order of its rows, the view's header and
footer, the machine's boot), and a later mount that wants those very bytes (a job run again at
the epoch it stopped in, or at the next one, whose stage the mount before built ahead) reads
that file as it is.  Anything else (another order, a changed source, a file changed on disk)
never matches: its stage is written again, and the bytes are those a daemon-served mount
gives."""

from __future__ import annotations

import json
import mmap
import os
import time
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402

ARGS = ("--seed", "3", "--buffer", "2MiB")
NAMES = pf.TWO_FILES


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return pf.two_files(tmp_path / "pqsrc")


def keyed(cache: Path) -> list[Path]:
    """The spare stage files that hold a stage known by its key."""
    d = cache / "kept-copies"
    return sorted(p for p in d.glob("spare-k*")) if d.is_dir() else []


def made(m, name: str) -> str:
    return json.loads(m.xattr("info", name))["parquet"]["stage"]["made"]


def settle(m) -> dict:
    """The mount's passthrough stats once no stage is being built ahead (as a job whose epoch
    outlasts a build finds it)."""
    deadline = time.monotonic() + 60
    while True:
        got = m.stats()["passthrough"]
        if not got.get("building_ahead") or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def first_mount(mount, src: Path, *args: str) -> tuple[Path, dict[str, bytes]]:
    """(the cache directory of a mount that read every view once, then was unmounted, the bytes)."""
    m = mount(None, *ARGS, *args, src=src)
    if not m.stats()["passthrough"]["on"]:
        pytest.skip("no FUSE passthrough here: no stages")
    got = {name: m.path(name).read_bytes() for name in NAMES}
    settle(m)
    m.stop()
    assert m.returncode == 0, m.stderr()
    return m.cache, got


def test_a_later_mount_reads_the_stages_a_mount_kept_at_the_same_and_the_next_epoch(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-kept-stages"""
    cache, epoch0 = first_mount(mount, src)
    assert keyed(cache), sorted(os.listdir(cache / "kept-copies"))
    served = mount(None, *ARGS, "--passthrough", "off", src=src, name="served")
    later = mount(None, *ARGS, "--cache-dir", str(cache), src=src, name="later")
    for name in NAMES:
        got = later.path(name).read_bytes()
        assert got == epoch0[name] == served.path(name).read_bytes()
        assert "kept" in made(later, name) and "by an earlier mount" in made(later, name), made(later, name)
        assert pq.read_table(later.path(name)).num_rows == pq.read_table(src / name).num_rows
    assert later.stats()["passthrough"]["stages_kept"] >= len(NAMES)  # and maybe the one it builds ahead
    settle(later)
    later.stop()
    assert later.returncode == 0, later.stderr()
    # a job run again at the next epoch: the stage the mount before built ahead (the file read alone)
    resumed = mount(None, *ARGS, "--epoch", "1", "--cache-dir", str(cache), src=src, name="resumed")
    served.set_epoch(1)
    for name in NAMES:
        assert resumed.path(name).read_bytes() == served.path(name).read_bytes() != epoch0[name]
    assert resumed.stats()["passthrough"]["stages_kept"] >= 1, resumed.stats()["passthrough"]


@pytest.mark.parametrize("change", ["seed", "source", "file"])
def test_a_kept_stage_of_other_bytes_is_never_read(mount, src: Path, change: str):
    """Another seed (another order), a source rewritten since, or the kept file changed on disk:
    no stage is taken as it is, and every view holds the daemon-served bytes.
    Holds: SEMANTICS.md#views-parquet-kept-stages, SEMANTICS.md#changes-new-open"""
    cache, _ = first_mount(mount, src)
    files = keyed(cache)
    assert files
    args: tuple[str, ...] = ()
    if change == "seed":
        args = ("--seed", "4")
    elif change == "source":
        pf.label_sorted(src / NAMES[1], n=20_000, group_rows=4_000, seed=11)  # same size, other rows
        pf.write_pyarrow(src / NAMES[0])  # the same rows, written again: a new version all the same
    else:
        for p in files:
            with open(p, "r+b") as f:  # a byte of the middle changed, the size kept
                f.seek(p.stat().st_size // 2)
                f.write(b"\xa5")
            os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 1))
    later = mount(None, *ARGS, *args, "--cache-dir", str(cache), src=src, name="later")
    served = mount(None, *ARGS, *args, "--passthrough", "off", src=src, name="served")
    for name in NAMES:
        assert later.path(name).read_bytes() == served.path(name).read_bytes()
        assert "kept" not in made(later, name)
    assert later.stats()["passthrough"]["stages_kept"] == 0
    if change == "file":
        assert "changed since it was kept" in later.stderr()


def test_a_kill_leaves_no_stage_that_a_later_mount_would_take(mount, src: Path):
    """A mount killed while it wrote stages into files an earlier mount kept: none of them is
    taken whole by the next mount.  Holds: SEMANTICS.md#views-parquet-kept-stages"""
    cache, epoch0 = first_mount(mount, src)
    killed = mount(None, *ARGS, "--epoch", "5", "--cache-dir", str(cache), src=src, name="killed")
    for name in NAMES:
        killed.path(name).read_bytes()
    os.kill(killed.pid, 9)
    killed.wait()
    killed.stop()
    later = mount(None, *ARGS, "--cache-dir", str(cache), src=src, name="later")
    served = mount(None, *ARGS, "--passthrough", "off", src=src, name="served")
    pf.read_as_served(later, served, (0, 5), epoch0)


def test_a_stage_read_from_disk_answers_a_readers_hints_without_the_daemon_reading_it(mount, src: Path):
    """A kept stage on disk only: a reader's ``POSIX_FADV_WILLNEED`` over the view makes the
    kernel read ahead into the view's own page cache, which no handle reads; the daemon refuses
    what is not in the page cache instead of reading it from disk, and every read (``read``,
    ``mmap``) still gets the stage's bytes.  Holds: SEMANTICS.md#views-parquet-passthrough"""
    cache, epoch0 = first_mount(mount, src)
    later = mount(None, *ARGS, "--cache-dir", str(cache), src=src, name="later")
    for name in NAMES:
        fd = os.open(later.path(name), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            settle(later)  # the open's own read-ahead of the stage is done once the build ahead is
            taken = list(cache.rglob("stage-kept-*"))  # the kept stages this mount took
            assert taken
            for path in taken:  # then on disk only, as after a while
                pf.drop_from_page_cache(path)
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            got = b"".join(os.pread(fd, 1 << 20, off) for off in range(0, size, 1 << 20))
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
                assert got == mapped[:] == epoch0[name]
        finally:
            os.close(fd)
        assert "by an earlier mount" in made(later, name), made(later, name)
    assert later.stats()["compiled_replies"]["readahead_refused"] > 0, later.stats()["compiled_replies"]
    assert pq.read_table(later.path(NAMES[0]), memory_map=True).num_rows == pq.read_table(src / NAMES[0]).num_rows
    settle(later)
    later.stop()
    assert later.returncode == 0, later.stderr()
