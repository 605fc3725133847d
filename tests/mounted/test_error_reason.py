"""Level: mounted (real FUSE mounts, real readers).

The reason for an errno is readable from the mount: ``user.shufflefs.error`` of the path and
`shufflefs stat`; and files too small for block orders are named by `shufflefs stat`."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from conftest import REPO

LINES = b"".join(b'{"id": %05d, "pad": "%s"}\n' % (i, b"x" * (i % 23)) for i in range(3000))
BAD_CSV = b'a,b\n1,"never closed\n2,3\n'
GOOD_CSV = b"a,b\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(500))
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3"]
ERROR = "user.shufflefs.error"


def _shufflefs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60)


def _errno_of(call) -> int | None:
    try:
        call()
    except OSError as e:
        return e.errno
    return None


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_the_last_error_of_a_path_is_an_attribute_until_a_later_open_reads_it(mount):
    """Holds: SEMANTICS.md#errors-reason"""
    m = mount({"bad.csv": BAD_CSV, "good.jsonl": LINES * 8}, *ARGS)
    bad, good = m.path("bad.csv"), m.path("good.jsonl")
    assert _errno_of(lambda: os.getxattr(good, ERROR)) == errno.ENODATA
    assert ERROR not in os.listxattr(good)
    assert _errno_of(lambda: _read(bad)) == errno.EIO

    reason = os.getxattr(bad, ERROR).decode()
    assert " EIO " in reason and "bad.csv" in reason and "(epoch 0)" in reason, reason
    assert ERROR in os.listxattr(bad)
    got = subprocess.run(["getfattr", "--only-values", "-n", ERROR, str(bad)], capture_output=True, text=True)
    assert got.returncode == 0 and got.stdout == reason, got
    assert _errno_of(lambda: os.setxattr(bad, ERROR, b"x")) == errno.EPERM
    assert _errno_of(lambda: os.removexattr(bad, ERROR)) == errno.EPERM

    m.set_epoch(1)  # kept across epochs: the reader may look after the epoch moved on
    assert os.getxattr(bad, ERROR).decode() == reason
    out = _shufflefs("stat", str(m.path()))
    assert out.returncode == 0 and "getfattr -n user.shufflefs.error" in out.stdout and "bad.csv" in out.stdout, out

    # a read that fails later, at an offset: the attribute names the errno and the offset
    fd = os.open(good, os.O_RDONLY)
    try:
        assert len(os.pread(fd, 4096, 0)) == 4096
        with open(m.src / "good.jsonl", "ab") as src:
            src.write(b'{"id": 99999}\n')
        assert _errno_of(lambda: os.pread(fd, 4096, 512 << 10)) == errno.ESTALE  # past any readahead
    finally:
        os.close(fd)
    reason = os.getxattr(good, ERROR).decode()
    assert " ESTALE " in reason and "good.jsonl" in reason and "at view offset " in reason, reason
    assert "(epoch 1)" in reason

    # repaired: the next open that reads clears it
    (m.src / "bad.csv").write_bytes(GOOD_CSV)
    for _ in range(3):  # the kernel may hold the old name for a second: ESTALE, then a fresh lookup
        try:
            data = _read(bad)
            break
        except OSError as e:
            assert e.errno == errno.ESTALE, e
    assert sorted(data.splitlines()) == sorted(GOOD_CSV.splitlines())
    assert _errno_of(lambda: os.getxattr(bad, ERROR)) == errno.ENODATA
    assert ERROR not in os.listxattr(bad)
    assert sorted(_read(good).splitlines()) == sorted((LINES * 8 + b'{"id": 99999}\n').splitlines())
    assert _errno_of(lambda: os.getxattr(good, ERROR)) == errno.ENODATA


@pytest.mark.parametrize("strategy", ["block", "corgipile"])
def test_a_file_too_small_for_automatic_blocks_is_named_by_stat(mount, strategy):
    small = b"a,b\n" + b"".join(b"%d,%d\n" % (i, i) for i in range(800))  # ~7 KB: 2 blocks of a page
    m = mount({"small.csv": small, "big.jsonl": LINES * 8}, "--strategy", strategy)
    _read(m.path("small.csv"))
    _read(m.path("big.jsonl"))
    assert m.stats()["few_blocks"] == {"small.csv": 2}
    out = _shufflefs("stat", str(m.path()))
    assert out.returncode == 0, out
    line = next(x for x in out.stdout.splitlines() if "small.csv" in x)
    assert "2 block(s) of the automatic size" in line and "--strategy full" in line, line
    assert "given" not in out.stdout
