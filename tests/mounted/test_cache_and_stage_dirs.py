"""Level: mounted (real FUSE mounts, real readers).

Where a mount writes: never in a system directory or another user's (a usage error before any
daemon starts), and a cache directory that cannot be written is no reason not to mount (one
warning, its indexes still used, new ones kept until the mount ends)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from conftest import REPO, write_tree

from shufflefs.config import MountConfig
from shufflefs.fs import daemon

LINES = b"".join(b'{"i": %d}\n' % i for i in range(3000))
PLS = ["--strategy", "pls", "--world-size", "2", "--exchange", "0.25", "--block-size", "4096"]
NOBODY = 65534


def shufflefs(*args: str | os.PathLike, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(env or os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    src = write_tree(tmp_path / "src", {"a.jsonl": LINES})
    (tmp_path / "mnt").mkdir()
    return src, tmp_path / "mnt"


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` made read-only by a read-only bind mount of itself (root writes through modes)."""
    r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {r.stderr.strip()}")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# --------------------------------------------------------------------------- refused places

SYSTEM = [
    (["--cache-dir", "/"], "cache directory / is the system directory /"),
    (["--cache-dir", "/etc"], "cache directory /etc is the system directory /etc"),
    (["--cache-dir", "/etc/shufflefs-test-cache"], "is in the system directory /etc"),
    (["--cache-dir", "/usr/lib"], "is in the system directory /usr"),
    (["--cache-dir", "/var"], "the system directory /var"),
    (["--cache-dir", "/run"], "the system directory /run"),
    (["--cache-dir", "/proc/self"], "system directory /proc"),
    ([*PLS, "--stage-dir", "/etc"], "stage directory /etc is the system directory /etc"),
    ([*PLS, "--stage-dir", "/"], "stage directory / is the system directory /"),
    ([*PLS, "--stage-dir", "/sys/fs"], "system directory /sys"),
]


@pytest.mark.parametrize("args, message", SYSTEM)
def test_system_directories_are_refused_before_the_daemon_starts(dirs, tmp_path, args, message):
    src, mnt = dirs
    r = shufflefs("mount", src, mnt, *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert ("--stage-dir" if "--stage-dir" in args else "--cache-dir") in r.stderr
    assert not os.path.exists("/etc/shufflefs-test-cache") and not os.listdir(mnt)


def test_a_link_to_a_system_directory_is_that_directory(dirs, tmp_path):
    src, mnt = dirs
    (tmp_path / "cache").symlink_to("/etc")
    r = shufflefs("mount", src, mnt, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 2 and "system directory /etc" in r.stderr, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
@pytest.mark.parametrize("option", ["--cache-dir", "--stage-dir"])
def test_another_users_directory_is_refused_even_for_root(dirs, tmp_path, option):
    src, mnt = dirs
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    r = shufflefs("mount", src, mnt, *(PLS if option == "--stage-dir" else []), option, theirs)
    assert r.returncode == 2 and f"{theirs} belongs to" in r.stderr and "uid 65534" in r.stderr, r.stderr
    assert option in r.stderr and not os.listdir(theirs)
    # a directory of one's own below it (made by the daemon, or existing) is fine
    r = shufflefs("index", src, "--cache-dir", theirs / "mine")
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_default_cache_directory_of_another_user_is_refused(dirs, tmp_path):
    src, mnt = dirs
    (tmp_path / "xdg" / "shufflefs").mkdir(parents=True)
    os.chown(tmp_path / "xdg" / "shufflefs", NOBODY, NOBODY)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    for args in (["mount", src, mnt], ["index", src]):
        r = shufflefs(*args, env=env)
        assert r.returncode == 2 and "belongs to" in r.stderr and "--cache-dir" in r.stderr, r.stderr


def test_the_daemon_itself_refuses_a_system_directory(dirs):
    src, mnt = dirs
    assert daemon.run(MountConfig(src, mnt, cache_dir=Path("/etc"))) == daemon.EXIT_USAGE
    assert daemon.run(MountConfig(src, mnt, stage_dir=Path("/usr"))) == daemon.EXIT_USAGE
    assert not daemon.is_mounted(mnt)


# --------------------------------------------------------------------------- a read-only cache


def test_a_read_only_cache_directory_warns_once_and_still_serves(mount, tmp_path):
    cache = tmp_path / "ro-cache"
    first = mount({"a.jsonl": LINES}, "--cache-dir", str(cache))
    assert sorted(first.path("a.jsonl").read_bytes().splitlines()) == sorted(LINES.splitlines())
    first.stop()
    cached = sorted(cache.glob("*/*.npz"))
    assert len(cached) == 1  # a.jsonl's index, built by the first mount
    (first.src / "b.jsonl").write_bytes(LINES[: len(LINES) // 2])
    with read_only(cache):
        m = mount(None, "--cache-dir", str(cache), "-v", src=first.src)
        for rel in ("a.jsonl", "b.jsonl"):
            for epoch in (0, 1):
                m.set_epoch(epoch)
                want = (first.src / rel).read_bytes()
                assert sorted(m.path(rel).read_bytes().splitlines()) == sorted(want.splitlines())
        log = m.stderr()
        assert log.count("cannot be written") == 1 and "read-only file system" in log, log
        assert "cannot write index cache" not in log and "Traceback" not in log, log
        stats = m.stats()
        assert stats["cache_dir"] == str(cache) and "cannot be written" in stats["cache_warning"]
        assert "cache warning" in shufflefs("stat", m.mnt).stdout
        own = Path(tempfile.gettempdir()) / f"shufflefs-{m.pid}" / "index-cache"
        linked = sorted(own.glob("*/*.npz"))
        assert [p.resolve() for p in linked if p.is_symlink()] == cached  # the read-only entry, read
        assert len(linked) == 2  # and b.jsonl's, new, kept by the daemon
        m.stop()
        assert m.returncode == 0 and not own.exists()
        assert sorted(cache.glob("*/*.npz")) == cached

        # a background mount says it on the terminal (its daemon's log may go nowhere)
        mnt = tmp_path / "bg"
        mnt.mkdir()
        r = shufflefs("mount", first.src, mnt, "--cache-dir", cache)
        try:
            assert r.returncode == 0, r.stderr
            assert r.stderr.count("warning: cache directory") == 1 and "read-only file system" in r.stderr
            assert sorted((mnt / "a.jsonl").read_bytes().splitlines()) == sorted(LINES.splitlines())
        finally:
            assert shufflefs("umount", mnt).returncode == 0


def test_a_read_only_cache_directory_still_serves_compressed_files(mount, tmp_path):
    """A compressed file's index scan writes its decoded copy under the cache directory; where that
    cannot be written the view is served all the same (decoded from restart points), and its
    bytes are those of a mount that copies nothing.  Holds: SEMANTICS.md#views-compressed-copy"""
    import compressed_files as cf

    plain = cf.jsonl(6000, seed=3)
    first = mount({"a.jsonl.gz": cf.gz(plain)}, "--decoded-copies", "needed")
    want = first.path("a.jsonl.gz").read_bytes()
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    with read_only(cache):
        m = mount(None, "--cache-dir", str(cache), src=first.src)
        assert m.path("a.jsonl.gz").read_bytes() == want
        assert sorted(cf.lines_of(cf.decode("a.jsonl.gz", want))) == sorted(cf.lines_of(plain))
