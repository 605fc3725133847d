"""Level: mounted (real FUSE mounts, real readers).

An open of a Parquet view whose stage is still being written is answered at once, and its reads
are served from the stage as far as it is written; opens while such a handle is open are served
so too (the kernel refuses to pass an inode through while it caches it), and once they are all
closed the next open is passed through again.  Every way yields the bytes of a mount without
passthrough."""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402

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
