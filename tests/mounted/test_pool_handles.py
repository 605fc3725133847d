"""Level: mounted (real FUSE mounts, real readers).

An open handle of a pooled shard keeps the epoch it was opened at: a shard's size changes with
the epoch (its share of the pooled stream holds other records), yet `fstat` on an open descriptor
and the bytes read through it are both the opening epoch's, and agree with each other, however
often the epoch changes meanwhile.  A `stat` before the `open` may see another epoch than the
open when the epoch changes in between (a new epoch is a new inode)."""

from __future__ import annotations

import os
import time

from test_mount_pools import POOL_ARGS, SIZES, pooled_reference, shard_files

from shufflefs.fs.fuse_ops import META_TIMEOUT

NAMES = sorted(SIZES)


def read_fd(fd: int) -> bytes:
    """The whole file through ``fd`` by offset (pread), in odd-sized pieces."""
    out, off = bytearray(), 0
    while True:
        got = os.pread(fd, 3001, off)
        if not got:
            return bytes(out)
        out += got
        off += len(got)


def shard_changing_size(files: dict[str, bytes], strategy: str, a: int, b: int) -> int:
    """A shard whose size differs between epochs ``a`` and ``b``."""
    ra, rb = pooled_reference(files, NAMES, strategy, a), pooled_reference(files, NAMES, strategy, b)
    changing = [i for i in range(len(NAMES)) if len(ra[i]) != len(rb[i])]
    assert changing, "no shard changes size between the epochs: pick other epochs"
    return changing[0]


def test_an_open_shard_keeps_its_epochs_size_and_bytes_across_epoch_changes(mount):
    """Holds: SEMANTICS.md#views-size
    Holds: SEMANTICS.md#epochs-pool-handle, SEMANTICS.md#epochs-handles"""
    files = shard_files()
    m = mount(files, *POOL_ARGS, "--strategy", "corgipile")
    i = shard_changing_size(files, "corgipile", 0, 1)
    path = m.path(NAMES[i])
    want0, want1 = pooled_reference(files, NAMES, "corgipile", 0)[i], pooled_reference(files, NAMES, "corgipile", 1)[i]
    m.set_epoch(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == len(want0)
        head = os.pread(fd, 100, 0)  # a read before the change, the rest after
        m.set_epoch(1)
        assert os.stat(path).st_size == len(want1), "a new lookup sees the new epoch"
        for epoch in range(2, 12):  # idle views of old epochs are closed, plans dropped
            m.set_epoch(epoch)
            with open(path, "rb") as f:
                f.read()
        m.set_epoch(1)
        time.sleep(META_TIMEOUT + 0.2)  # the kernel's cached attributes expired: the daemon answers
        size = os.fstat(fd).st_size
        got = read_fd(fd)
        assert size == len(got) == len(want0), "fstat and the bytes are the opening epoch's"
        assert got == want0 and got[:100] == head
        with open(path, "rb") as f:  # a new open: the current epoch
            assert os.fstat(f.fileno()).st_size == len(want1)
            assert f.read() == want1
        assert os.fstat(fd).st_size == len(want0)
    finally:
        os.close(fd)


def test_a_stat_before_the_open_may_see_another_epoch_than_the_open(mount):
    """Holds: SEMANTICS.md#views-size.  A reader that checks a size must take it from its open
    descriptor (fstat), not from a stat of the path made before the open.
    Holds: SEMANTICS.md#epochs-stat-race"""
    files = shard_files()
    m = mount(files, *POOL_ARGS, "--strategy", "full")
    i = shard_changing_size(files, "full", 3, 4)
    path = m.path(NAMES[i])
    want3, want4 = pooled_reference(files, NAMES, "full", 3)[i], pooled_reference(files, NAMES, "full", 4)[i]
    m.set_epoch(3)
    before = os.stat(path).st_size
    m.set_epoch(4)  # between the stat and the open
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        got = f.read()
    assert before == len(want3)
    assert size == len(got) == len(want4) != before
    assert got == want4
