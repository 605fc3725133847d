"""Published indexes for a local or shared-filesystem source: `shufflefs index SRC --publish
--index-dir DIR` writes them once, and a mount with ``--index-dir DIR`` takes a file's index from
there when it matches the file's version (nothing scanned, DIR never written), and indexes a
file that changed since by itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import write_tree
from test_mount import jsonl, lines

FILES = {"a.jsonl": jsonl(4000, 1), "sub/b.jsonl": jsonl(2500, 2)}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def entries(root: Path) -> list[Path]:
    return list(root.rglob("*.npz"))


def test_a_mount_takes_published_indexes_and_never_writes_them(mount, tmp_path):
    src = write_tree(tmp_path / "src", FILES)
    shared = tmp_path / "shared-indexes"
    shared.mkdir()
    r = cli("index", src, "--publish", "--index-dir", shared)
    assert r.returncode == 0, r.stderr
    assert len(entries(shared)) == 2
    before = snapshot(shared)
    m = mount(None, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, src=src, name="plain")
    for rel in FILES:
        got = m.path(rel).read_bytes()
        assert got == plain.path(rel).read_bytes()
        assert sorted(lines(got)) == sorted(lines(FILES[rel]))
    assert entries(m.cache) == []  # nothing was scanned: both indexes came from the shared path
    assert len(entries(plain.cache)) == 2
    assert snapshot(shared) == before

    # a file rewritten since publishing: its published index names the old version
    (src / "a.jsonl").write_bytes(jsonl(3000, 9))
    os.utime(src / "a.jsonl", ns=(1, 1))
    m.set_epoch(1)
    got = m.path("a.jsonl").read_bytes()
    assert sorted(lines(got)) == sorted(lines(jsonl(3000, 9)))
    assert len(entries(m.cache)) == 1  # indexed here, kept in the mount's own cache
    assert snapshot(shared) == before


def test_index_dir_errors(tmp_path):
    src = write_tree(tmp_path / "src", FILES)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = cli("index", src, "--publish")
    assert r.returncode == 2 and "--index-dir" in r.stderr
    r = cli("index", src, "--index-dir", tmp_path)
    assert r.returncode == 2 and "--publish" in r.stderr
    r = cli("mount", src, mnt, "--index-dir", tmp_path / "missing")
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = cli("mount", "s3://bucket/prefix", mnt, "--index-dir", tmp_path)
    assert r.returncode == 2 and "--index-url" in r.stderr
    r = cli("index", src, "--publish", "--index-dir", src / "sub")  # never inside the source
    assert r.returncode == 2
    assert not list(src.rglob("*.npz"))
