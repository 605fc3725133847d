"""Level: mounted (real FUSE mounts, real readers).

Paths under a confined root never follow symbolic links (pure: no mount), and through a mount
a directory swapped for a link to elsewhere serves nothing from there."""

from __future__ import annotations

import errno
import os
import time
from typing import Iterator
from pathlib import Path

import pytest

from shufflefs import resolve


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_bytes(b"inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_bytes(b"SECRET\n")
    (root / "link").symlink_to(outside)
    (root / "flink.txt").symlink_to(root / "d" / "f.txt")
    resolve.confine(root)
    yield root
    resolve.release(root)


@pytest.mark.parametrize("walk", [False, True], ids=["openat2", "per-component"])
def test_links_on_the_way_are_eloop_and_plain_paths_open(tree, walk, monkeypatch):
    """Holds: SEMANTICS.md#never-opened-beneath"""
    if walk:
        monkeypatch.setattr(resolve, "_have_openat2", False)
    fd = resolve.open_path(tree / "d" / "f.txt")
    assert os.read(fd, 100) == b"inside\n"
    os.close(fd)
    for bad in (tree / "link" / "f.txt", tree / "flink.txt"):
        with pytest.raises(OSError) as e:
            resolve.open_path(bad)
        assert e.value.errno == errno.ELOOP
    with pytest.raises(OSError) as e:
        resolve.stat_path(tree / "link" / "f.txt")
    assert e.value.errno == errno.ELOOP
    assert resolve.stat_path(tree / "link", follow_last=False).st_mode & 0o170000 == 0o120000
    assert sorted(resolve.list_dir(tree)) == ["d", "flink.txt", "link"]
    with pytest.raises(OSError):
        resolve.list_dir(tree / "link")
    assert resolve.readlink_beneath(tree / "flink.txt") == str(tree / "d" / "f.txt")


def test_bytes_paths_resolve_the_same_and_release_ends_confinement(tree, tmp_path):
    fd = resolve.open_path(os.fsencode(tree / "d" / "f.txt"))
    assert os.read(fd, 100) == b"inside\n"
    os.close(fd)
    with pytest.raises(OSError) as e:
        resolve.open_path(os.fsencode(tree / "flink.txt"))
    assert e.value.errno == errno.ELOOP
    resolve.confine(tree)  # a second user (two catalogs of one tree)
    resolve.release(tree)
    with pytest.raises(OSError):
        resolve.open_path(tree / "flink.txt")  # still confined: one user left
    resolve.release(tree)
    fd = resolve.open_path(tree / "flink.txt")  # no longer confined: links are followed as usual
    os.close(fd)
    resolve.confine(tree)  # for the fixture's release


def test_a_swapped_directory_is_not_followed(tree):
    """Holds: SEMANTICS.md#never-opened-beneath"""
    os.rename(tree / "d", tree / "d.old")
    os.symlink(tree.parent / "outside", tree / "d")
    with pytest.raises(OSError) as e:
        resolve.open_path(tree / "d" / "f.txt")
    assert e.value.errno == errno.ELOOP


def test_paths_outside_the_roots_open_as_usual(tree, tmp_path):
    fd = resolve.open_path(tmp_path / "outside" / "f.txt")
    assert os.read(fd, 100) == b"SECRET\n"
    os.close(fd)


def test_a_mount_never_serves_what_a_swapped_directory_points_to(mount, tmp_path):
    """Holds: SEMANTICS.md#never-opened-beneath, SEMANTICS.md#never-opened-swapped-dir"""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = b"".join(b'{"secret": %d}\n' % i for i in range(100))
    (outside / "a.jsonl").write_bytes(secret)
    (outside / "plain.bin").write_bytes(b"SECRET" * 100)
    m = mount({"d/a.jsonl": b"".join(b'{"ok": %d}\n' % i for i in range(100)), "d/plain.bin": b"fine" * 100})
    assert b"ok" in open(m.path("d/a.jsonl"), "rb").read()
    assert open(m.path("d/plain.bin"), "rb").read() == b"fine" * 100
    os.rename(m.src / "d", m.src / "d.old")
    os.symlink(outside, m.src / "d")
    deadline = 30
    for _ in range(deadline):  # lookups cached by the kernel for up to a second must never help
        for rel in ("d/a.jsonl", "d/plain.bin"):
            try:
                got = open(m.path(rel), "rb").read()
            except OSError:
                continue
            assert b"secret" not in got.lower(), f"{rel} served the link's target"
    # the link itself is shown as a link leaving the source: hidden
    assert not os.path.exists(m.path("d/a.jsonl")) or b"secret" not in open(m.path("d/a.jsonl"), "rb").read().lower()


def test_a_swapped_directory_reads_as_gone_with_a_log_line(mount, tmp_path):
    """A directory that became a symbolic link is gone as far as the mount is concerned: every
    path through it is ENOENT (never ELOOP, never the link's target), and the log names it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.jsonl").write_bytes(b'{"secret": 1}\n')
    (outside / "plain.bin").write_bytes(b"SECRET")
    m = mount({"d/a.jsonl": b"".join(b'{"ok": %d}\n' % i for i in range(100)), "d/plain.bin": b"fine",
               "d/sub/b.jsonl": b'{"ok": 0}\n'})
    assert sorted(os.listdir(m.path("d"))) == ["a.jsonl", "plain.bin", "sub"]
    a = open(m.path("d/a.jsonl"), "rb")  # opened before: its file left the path, as if renamed
    for rel in ("d/a.jsonl", "d/plain.bin", "d/sub/b.jsonl"):
        os.stat(m.path(rel))  # the kernel now holds every inode on these paths
    os.rename(m.src / "d", m.src / "d.old")
    os.symlink(outside, m.src / "d")
    for _ in range(3):  # while the kernel still holds the old entries, and after they expire
        for rel in ("d/a.jsonl", "d/plain.bin", "d/sub/b.jsonl", "d/sub", "d"):
            for op in (lambda p: open(p, "rb").read(), os.listdir, os.stat):
                try:
                    got = op(m.path(rel))
                except OSError as e:
                    assert e.errno in (errno.ENOENT, errno.ENOTDIR), (rel, op, e)
                    continue
                assert b"SECRET" not in (got if isinstance(got, bytes) else b"").upper(), rel
        time.sleep(0.6)
    with pytest.raises(OSError) as e:
        a.read()
    assert e.value.errno == errno.ESTALE
    a.close()
    assert "a directory on its path is a symbolic link now; not followed" in m.stderr()
    assert str(m.src / "d") in m.stderr()
