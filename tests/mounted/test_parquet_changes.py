"""Level: mounted (real FUSE mounts, real readers).

A Parquet file's decoded copy (made once per file version, filled as windows need it, shown by
``user.shufflefs.info`` and ``shufflefs stat``, removed at unmount), a Parquet file changed while
mounted (handles opened before get ESTALE, opens after it the new rows), and damaged files: not
Parquet, cut short, or with a page that does not decode are EIO with the reason in
``user.shufflefs.error``, while the mount serves the other files."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402

ARGS = ("--seed", "1", "--buffer", "1MiB")


def _table(n: int, first: int = 0):
    rng = np.random.default_rng(first)
    return pa.table({"id": np.arange(first, first + n), "text": ["x" * int(k) for k in rng.integers(0, 400, n)],
                     "tags": pa.array([[int(v)] * int(v % 3) for v in rng.integers(0, 9, n)], pa.list_(pa.int32()))})


def test_a_decoded_copy_is_made_once_per_version_shown_and_removed_at_unmount(mount, tmp_path):
    """Holds: SEMANTICS.md#views-parquet-copy"""
    d = tmp_path / "src"
    d.mkdir()
    pf.label_sorted(d / "a.parquet", n=12_000, group_rows=2_000)
    m = mount(None, *ARGS, src=d)
    first = pq.read_table(m.path("a.parquet"))
    info = json.loads(m.xattr("info", "a.parquet"))["parquet"]
    copy = info["copy"]
    assert copy["row_groups"] == 6 and copy["copied"] == 6 and copy["views"] >= 1
    assert info["row_groups"] >= 2 and info["encoding"].startswith("PLAIN, uncompressed")
    where = Path(info["copy_dir"])
    files = list(where.iterdir())
    assert len(files) == 1 and where.parent == m.cache  # node-local: under the cache directory
    m.set_epoch(1)
    second = pq.read_table(m.path("a.parquet"))
    assert second.column("id").to_pylist() != first.column("id").to_pylist()
    assert list(where.iterdir()) == files  # the same copy serves the next epoch
    stats = m.stats()
    assert stats["parquet_copies"]["copies"][str(d / "a.parquet")]["copied"] == 6
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(m.path())], capture_output=True, text=True,
                         timeout=60).stdout
    assert "parquet copy" in out and "6 of 6 row groups" in out, out
    m.stop()
    assert not where.exists()


@pytest.mark.parametrize("passthrough", ["off", "auto"])
def test_a_file_changed_while_mounted(mount, tmp_path, passthrough):
    """Served by the daemon, a handle opened before the change gets ESTALE for bytes it did not
    read yet; read by the kernel from its stage (passthrough), it reads the old version's view
    whole, never a byte of the new one.  Either way an open after the change reads the new
    version's rows.  Holds: SEMANTICS.md#changes-open-estale, SEMANTICS.md#changes-new-open,
    SEMANTICS.md#views-parquet-passthrough"""
    d = tmp_path / "src"
    d.mkdir()
    pq.write_table(_table(6_000), d / "c.parquet", row_group_size=1_000)
    m = mount(None, *ARGS, "--passthrough", passthrough, src=d)
    path = m.path("c.parquet")
    assert sorted(pq.read_table(path).column("id").to_pylist()) == list(range(6_000))
    m.set_epoch(3)
    fd = os.open(path, os.O_RDONLY)
    staged = m.stats()["passthrough"]["on"]
    assert staged == (passthrough == "auto" and os.geteuid() == 0)
    try:
        size = os.fstat(fd).st_size
        os.pread(fd, 4, 0)
        pq.write_table(_table(5_000, first=100_000), tmp_path / "new.parquet", row_group_size=1_000)
        os.replace(tmp_path / "new.parquet", d / "c.parquet")
        if staged:
            with os.fdopen(os.dup(fd), "rb") as f:
                old = pq.read_table(f).column("id").to_pylist()
            assert sorted(old) == list(range(6_000))
        else:
            with pytest.raises(OSError) as e:
                os.pread(fd, 1 << 16, size // 2)
            assert e.value.errno == errno.ESTALE
    finally:
        os.close(fd)
    got = pq.read_table(path).column("id").to_pylist()
    assert sorted(got) == list(range(100_000, 105_000))


def _damaged_page(good: Path, bad: Path) -> None:
    shutil.copy(good, bad)
    at = pq.ParquetFile(good).metadata.row_group(2).column(1).data_page_offset
    with open(bad, "r+b") as f:  # the page header of a chunk of row group 2: garbage
        f.seek(at)
        f.write(b"\xff" * 16)


def test_damaged_files_are_eio_with_a_reason(mount, tmp_path):
    """Holds: SEMANTICS.md#errors-eio, SEMANTICS.md#errors-reason, SEMANTICS.md#views-parquet"""
    d = tmp_path / "src"
    d.mkdir()
    pq.write_table(_table(5_000), d / "good.parquet", row_group_size=1_000, compression="none")
    (d / "json.parquet").write_bytes(b'{"a": 1}\n' * 100)
    (d / "cut.parquet").write_bytes((d / "good.parquet").read_bytes()[:-100])
    _damaged_page(d / "good.parquet", d / "page.parquet")
    m = mount(None, *ARGS, src=d)
    reasons = {"json.parquet": "no Parquet magic", "cut.parquet": "Parquet", "page.parquet": "row group 2"}
    for name, reason in reasons.items():
        assert os.stat(m.path(name)).st_size == 0
        with pytest.raises(OSError) as e:
            with open(m.path(name), "rb") as f:
                f.read()
        assert e.value.errno == errno.EIO, name
        line = m.xattr("error", name)
        assert "EIO" in line and reason in line and name in line, line
    assert sorted(pq.read_table(m.path("good.parquet")).column("id").to_pylist()) == list(range(5_000))


def test_a_view_may_hold_three_of_its_row_groups(mount, tmp_path):
    """A Parquet view's windows are pieces of its row groups (about 8 MiB): the mount's window
    memory is three of its row groups, not three pieces.  Holds: SEMANTICS.md#memory-windows,
    SEMANTICS.md#views-parquet-copy"""
    d = tmp_path / "src"
    d.mkdir()
    pf.label_sorted(d / "a.parquet", n=200_000, group_rows=20_000)
    m = mount(None, "--buffer", "24MiB", src=d)
    path = m.path("a.parquet")
    rows = sum(b.num_rows for b in pq.ParquetFile(path).iter_batches())
    md = pq.ParquetFile(path).metadata
    largest = max(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    assert rows == 200_000 and md.num_row_groups >= 4 and largest > 2 * (8 << 20)
    assert m.stats()["memory"]["limit_bytes"] >= 3 * largest
