"""Level: mounted (real FUSE mounts, real readers).

A directory of thousands of files lists every name once with the sizes its views have, resumes a
listing where the reader left it (``seekdir``), and neither reads nor indexes a file that is only
listed; a file changed or removed right after a listing opens as it is now."""

from __future__ import annotations

import collections
import ctypes
import errno
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

N_TEXT = 6000
N_PLAIN = 600


def _text(i: int) -> bytes:
    end = b"" if i % 3 == 0 else b"\n"  # a third without the final newline: their views are as long
    return b'{"i": %d}\n{"j": %d}' % (i, i) + end


def _files() -> dict[str, bytes | None]:
    files: dict[str, bytes | None] = {f"d/t{i:05d}.jsonl": _text(i) for i in range(N_TEXT)}
    files.update({f"d/p{i:05d}.bin": b"x" * (i % 37) for i in range(N_PLAIN)})
    files.update({f"d/sub{i}": None for i in range(5)})
    return files


def _view_size(data: bytes) -> int:
    return len(data)  # a last line without its newline is given last, unchanged (SEMANTICS.md#views-torn)


def _cache_files(m) -> list[str]:
    return [f for _, _, files in os.walk(m.cache) for f in files] if m.cache.exists() else []


class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64), ("d_reclen", ctypes.c_ushort),
                ("d_type", ctypes.c_ubyte), ("d_name", ctypes.c_char * 256)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.opendir.restype = ctypes.c_void_p
_libc.opendir.argtypes = [ctypes.c_char_p]
_libc.readdir.restype = ctypes.POINTER(_Dirent)
_libc.readdir.argtypes = [ctypes.c_void_p]
_libc.telldir.restype = ctypes.c_long
_libc.telldir.argtypes = [ctypes.c_void_p]
_libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
_libc.closedir.argtypes = [ctypes.c_void_p]


def _read_names(dirp: int, n: int | None = None) -> list[str]:
    out = []
    while n is None or len(out) < n:
        ent = _libc.readdir(dirp)
        if not ent:
            break
        out.append(ent.contents.d_name.decode())
    return out


def test_a_large_directory_lists_every_name_once_with_view_sizes_and_indexes_nothing(mount):
    files = _files()
    m = mount(files)
    d = m.path("d")
    names = os.listdir(d)
    counts = collections.Counter(names)
    assert not [n for n, c in counts.items() if c > 1]
    assert set(names) == {Path(rel).name for rel in files if rel.startswith("d/")}

    for rel, data in files.items():  # what ls -l asks of every entry
        st = os.lstat(m.path(rel))
        if data is None:
            assert stat.S_ISDIR(st.st_mode), rel
        elif rel.endswith(".jsonl"):
            assert stat.S_ISREG(st.st_mode) and st.st_size == _view_size(data), rel
        else:
            assert stat.S_ISREG(st.st_mode) and st.st_size == len(data), rel
    assert _cache_files(m) == []  # nothing indexed
    assert m.stats()["files_opened"] == 0

    # a listing resumed where the reader left it (telldir/seekdir: readdir from an offset)
    dirp = _libc.opendir(os.fsencode(d))
    assert dirp
    try:
        head = _read_names(dirp, 2500)
        pos = _libc.telldir(dirp)
        rest = _read_names(dirp)
        _libc.seekdir(dirp, pos)
        again = _read_names(dirp)
    finally:
        _libc.closedir(dirp)
    assert again == rest
    assert collections.Counter(head + rest) == collections.Counter(names)

    # a sanity check of the check above: an open does index
    rel = "d/t00001.jsonl"
    assert sorted(open(m.path(rel), "rb").read().splitlines()) == sorted(files[rel].splitlines())
    assert _cache_files(m)


def test_a_file_changed_or_removed_right_after_a_listing_opens_as_it_is_now(mount):
    """Names just listed and stat'ed (kept by the kernel and answered from the listing): an open
    right after the source changed shows the new version, a removed file is ENOENT.
    Holds: SEMANTICS.md#tree-attrs, SEMANTICS.md#changes-new-open"""
    files = {f"d/t{i:05d}.jsonl": _text(i) for i in range(300)}
    m = mount(files)
    d = m.path("d")
    for _ in range(3):  # the lookups after a listing are answered from it
        assert len(os.listdir(d)) == 300
        for name in os.listdir(d):
            os.lstat(d / name)
        changed, removed = m.src / "d" / "t00002.jsonl", m.src / "d" / "t00004.jsonl"
        new = b"".join(b'{"new": %d}\n' % i for i in range(50))
        changed.write_bytes(new)
        removed.unlink()
        with open(d / "t00002.jsonl", "rb") as f:
            assert os.fstat(f.fileno()).st_size == len(new)
            assert sorted(f.read().splitlines()) == sorted(new.splitlines())
        with pytest.raises(OSError) as e:
            open(d / "t00004.jsonl", "rb")
        assert e.value.errno == errno.ENOENT
        removed.write_bytes(_text(4))
        changed.write_bytes(_text(2))


def test_an_epoch_change_is_seen_at_once_by_stat_and_open_of_a_path_just_stated(mount):
    """The kernel keeps a looked-up view's name; an epoch change (mount, directory, file) makes it
    drop them before the setxattr returns, so the very next stat and open show the new epoch.
    Holds: SEMANTICS.md#epochs-visible"""
    lines = b"".join(b'{"i": %d}\n' % i for i in range(400))
    files = {"a.jsonl": lines, "d/b.jsonl": lines, "d/e/c.jsonl": lines, "d/f.jsonl": lines}
    m = mount(files, "--seed", "3")
    paths = [m.path(rel) for rel in files]

    def seen() -> list[tuple[int, int, bytes]]:
        out = []
        for p in paths:
            st = os.stat(p)
            with open(p, "rb") as f:
                fst = os.fstat(f.fileno())
                out.append((st.st_ino, st.st_mtime_ns, f.read()))
            assert (fst.st_ino, fst.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), p
        return out

    def epochs() -> list[int]:
        return [int(os.getxattr(p, "user.shufflefs.epoch")) for p in paths]

    before = seen()
    assert seen() == before  # the same inodes while nothing changes (names kept or looked up)
    steps = [("", 1, [1, 1, 1, 1]), ("d", 2, [1, 2, 2, 2]), ("d/e/c.jsonl", 5, [1, 2, 5, 2]),
             ("d/e", 7, [1, 2, 7, 2]), ("", 1, [1, 1, 1, 1]), ("d/f.jsonl", 0, [1, 1, 1, 0])]
    for rel, epoch, expect in steps:
        for p in paths:
            os.stat(p)  # every name just looked up (and kept by the kernel)
        old = {p: os.stat(p) for p in paths}
        m.set_epoch(epoch, rel)
        now = seen()
        assert epochs() == expect, (rel, epoch)
        for p, (ino, mtime, data), e in zip(paths, now, expect):
            source = m.src / p.relative_to(m.mnt)
            assert mtime == source.stat().st_mtime_ns + e * 1_000_000_000, (rel, p)
            assert sorted(data.splitlines()) == sorted(lines.splitlines())
            if e != (old[p].st_mtime_ns - source.stat().st_mtime_ns) // 1_000_000_000:
                assert ino != old[p].st_ino, (rel, p)  # a new inode for the new epoch
    m.set_epoch(0)  # the bytes are each epoch's: back at epoch 0, as before
    assert [(mtime, data) for _, mtime, data in seen()] == [(mtime, data) for _, mtime, data in before]
    assert m.stats()["errors"] == 0


def test_ls_l_stops_asking_for_security_and_acl_attributes(mount):
    """``security.*`` and ``system.*`` attributes are ENOTSUP (not ENODATA), which ``ls -l`` takes
    as a filesystem without them, and setting one is EROFS; ours still read and write.
    Holds: SEMANTICS.md#errors-enotsup, SEMANTICS.md#errors-erofs"""
    m = mount({"a.jsonl": b'{"i": 1}\n', "p.bin": b"xyz", "d/b.jsonl": b'{"i": 2}\n'})
    for rel in ("", "a.jsonl", "p.bin", "d"):
        p = m.path(rel)
        for name in ("security.selinux", "system.posix_acl_access", "system.posix_acl_default"):
            with pytest.raises(OSError) as e:
                os.getxattr(p, name, follow_symlinks=False)
            assert e.value.errno == errno.ENOTSUP, (rel, name)
        with pytest.raises(OSError) as e:
            os.setxattr(p, "security.test", b"x")
        assert e.value.errno in (errno.EROFS, errno.EACCES), rel
        with pytest.raises(OSError) as e:
            os.getxattr(p, "trusted.nothing")
        assert e.value.errno == errno.ENODATA, rel
    assert m.xattr("epoch", "a.jsonl") == "0"
    m.set_epoch(3, "a.jsonl")
    assert m.xattr("epoch", "a.jsonl") == "3"
    assert "a.jsonl" in subprocess.run(["ls", "-l", str(m.path())], capture_output=True, text=True,
                                       check=True).stdout


@pytest.mark.parametrize("args", [("--rank", "1", "--world-size", "2"), ("--pool", "*.jsonl")])
def test_an_epoch_change_is_seen_at_once_in_shares_parts_and_pools(mount, args):
    """A rank's share, a loader part (``.parts/2/1/``) and a shard of a pool, each stat'ed just
    before: the next stat and open after the epoch change show the new epoch's size and bytes.
    Holds: SEMANTICS.md#epochs-visible"""
    files = {f"{name}.jsonl": b"".join(b'{"s": %d, "i": %d}\n' % (i, j) for j in range(50 + 40 * i))
             for i, name in enumerate("abc")}  # no shard names: pooled only by --pool
    m = mount(files, "--seed", "5", *args)
    if "--pool" in args:
        assert json.loads(m.xattr("info", "a.jsonl"))["pool_shards"] == 3
    paths = [m.path(rel) for rel in files] + [m.path(".parts/2/1/" + rel) for rel in files]

    def seen() -> list[tuple[int, int, bytes]]:
        out = []
        for p in paths:
            st = os.stat(p)
            with open(p, "rb") as f:
                data = f.read()
            assert len(data) == st.st_size, p  # the stat just before the open was of the same epoch
            out.append((st.st_size, st.st_mtime_ns, data))
        return out

    by_epoch = {}
    for epoch in (0, 1, 2, 1, 0):
        for p in paths:
            os.stat(p)
        m.set_epoch(epoch)
        got = seen()
        for (size, mtime, data), p in zip(got, paths):
            source = m.src / p.name
            assert mtime == source.stat().st_mtime_ns + epoch * 1_000_000_000, (epoch, p)
        assert by_epoch.setdefault(epoch, got) == got, epoch  # each epoch's bytes, every time
    assert by_epoch[0] != by_epoch[1]
    assert m.stats()["errors"] == 0
