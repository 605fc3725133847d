"""Level: mounted (real FUSE mounts, real readers).

Statements of docs/SEMANTICS.md that no other test holds: which files are views, what a view's
attributes and inodes are, shared and private mappings, epochs that a remount forgets, files
without an epoch, pass-through files that follow their source, pool shards and epoch changes,
index cache entries that do not match, directories swapped for links, special files under a
name, a hung source and a killed daemon.  Each test names the statements it holds.

Some of these statements describe behavior that is being built at the same time (their
docstrings say "Being built:"); they are written against the behavior as documented."""

from __future__ import annotations

import errno
import io
import json
import mmap
import os
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, bounded, is_mounted

from shufflefs.fs import control

LINES = b"".join(b'{"id": %05d, "pad": "%s"}\n' % (i, b"x" * (i % 23)) for i in range(3000))
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3"]
CAP = 90.0
"""Seconds after which a call that should have returned is taken for a hang (not a timing
assertion: only a guard, so that a regression fails the test instead of stalling the run)."""


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def read(path: Path | str, chunk: int = 1 << 16) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return b"".join(iter(lambda: f.read(chunk), b""))


def errno_of(fn) -> int | None:
    """The errno ``fn()`` raises, or None if it returns."""
    try:
        fn()
    except OSError as e:
        return e.errno
    return None


def shufflefs(*args: str, timeout: float = CAP) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


OPEN_READ = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
    data = os.read(fd, 100)
    print("read", len(data))
except OSError as e:
    print("errno", e.errno)
"""


# --------------------------------------------------------------------------- the tree


def wds_tar(n: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for j in range(n):
            for suffix, data in (("json", json.dumps({"j": j}).encode()), ("cls", b"%d" % (j % 3))):
                info = tarfile.TarInfo(f"{j:06d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_which_files_are_views(mount):
    """Views by extension and by ``--format`` rules; everything else, and ``GLOB=none``, passes
    through unchanged.  Holds: SEMANTICS.md#tree-views"""
    from shufflefs.formats.tfrecord import encode_frame

    views = {
        "a.jsonl": ("lines", LINES),
        "b.ndjson": ("lines", LINES),
        "c.txt": ("lines", LINES),
        "d.csv": ("csv", b"id,v\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(2000))),
        "e.tsv": ("lines", b"id\tv\n" + b"".join(b"%d\t%d\n" % (i, i * i) for i in range(2000))),
        "f.npy": ("npy", npy_bytes(np.arange(6000, dtype="<i4").reshape(2000, 3))),
        "g.tfrecords": ("tfrecord", b"".join(encode_frame(b"r%05d" % i) for i in range(1500))),
        "h.tar": ("tar", wds_tar(300)),
        "rec/i.rec": ("fixed", bytes(range(256)) * 64),
    }
    passed = {
        "j.bin": bytes(range(256)) * 64,  # .bin without --record-size
        "k.dat": LINES,
        "raw/l.jsonl": LINES,  # matched by GLOB=none
    }
    m = mount({**{k: v for k, (_, v) in views.items()}, **passed}, *ARGS, "--format", "raw/*=none",
              "--format", "rec/*.rec=fixed:record_size=16")
    for rel, (fmt, data) in views.items():
        assert m.xattr("format", rel) == fmt, rel
        got = read(m.path(rel))
        assert len(got) == len(data) and got != data, f"{rel}: not shuffled"
    for rel, data in passed.items():
        assert read(m.path(rel)) == data, rel
        assert os.listxattr(m.path(rel)) == [], rel


def test_special_files_are_hidden(mount):
    """FIFOs, sockets and devices in the source are neither listed nor found, and never opened.
    Holds: SEMANTICS.md#tree-hidden, SEMANTICS.md#never-opened-special, SEMANTICS.md#errors-enoent"""
    m = mount({"a.jsonl": LINES})
    os.mkfifo(m.src / "fifo.jsonl")
    os.mknod(m.src / "null.dat", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(m.src / "zero.jsonl", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    os.mknod(m.src / "loop.bin", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(m.src / "sock.jsonl"))
        names = bounded("import os, sys; print(sorted(os.listdir(sys.argv[1])))", str(m.mnt), mnt=m.mnt, timeout=CAP)
        assert names.stdout.strip() == "['a.jsonl']", names.stdout
        for name in ("fifo.jsonl", "null.dat", "zero.jsonl", "loop.bin", "sock.jsonl"):
            r = bounded(OPEN_READ, str(m.path(name)), mnt=m.mnt, timeout=CAP)
            assert r.stdout.split() == ["errno", str(errno.ENOENT)], (name, r.stdout, r.stderr)
            assert errno_of(lambda: os.lstat(m.path(name))) == errno.ENOENT, name
    finally:
        sock.close()
    assert sorted(read(m.path("a.jsonl")).splitlines()) == sorted(LINES.splitlines())


@pytest.mark.parametrize("kind", ["socket", "char-device", "fifo"])
def test_a_special_file_under_a_looked_up_name_is_refused_at_once(mount, kind):
    """A pass-through name the kernel still holds (it keeps those names for up to a second)
    swapped for a socket, a device (``/dev/zero``: an open would succeed and read zeros) or a
    FIFO: the open is refused with ENXIO or EIO and a log line, without blocking, and the mount
    goes on serving.  Being built: FIFOs, sockets and devices refused by the daemon.
    Holds: SEMANTICS.md#errors-enxio, SEMANTICS.md#never-opened-special"""
    m = mount({"a.jsonl": LINES})
    seen = []
    for attempt in range(4):
        name = f"p{attempt}.dat"
        src = m.src / name
        src.write_bytes(b"plain\n" * 100)
        assert os.stat(m.path(name)).st_size == 600  # looked up: the kernel keeps the name
        src.unlink()
        if kind == "socket":
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(src))
        elif kind == "fifo":
            os.mkfifo(src)
        else:
            os.mknod(src, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        try:
            r = bounded(OPEN_READ, str(m.path(name)), mnt=m.mnt, timeout=30)
        finally:
            if kind == "socket":
                sock.close()
        got = r.stdout.split()
        assert got[:1] == ["errno"], f"{kind} under {name} was read: {r.stdout} {r.stderr}"
        seen.append(int(got[1]))
        if int(got[1]) != errno.ENOENT:  # ENOENT: the kernel looked the name up again first
            break
    assert seen[-1] in (errno.ENXIO, errno.EIO), [errno.errorcode.get(e, e) for e in seen]
    assert name in m.stderr(), "no log line names the refused file"
    assert sorted(read(m.path("a.jsonl")).splitlines()) == sorted(LINES.splitlines())


# --------------------------------------------------------------------------- views


def test_view_attributes_and_inodes(mount):
    """Holds: SEMANTICS.md#views-inode, SEMANTICS.md#views-blksize, SEMANTICS.md#views-mtime"""
    m = mount({"a.jsonl": LINES, "b.jsonl": LINES[:20000], "d/n.npy": npy_bytes(np.arange(900).reshape(300, 3))}, *ARGS)
    inodes: dict[int, tuple] = {}  # inode number -> (path, epoch, source version): never two

    def look(rel: str, epoch: int, version: int) -> os.stat_result:
        st = os.stat(m.path(rel))
        assert inodes.setdefault(st.st_ino, (rel, epoch, version)) == (rel, epoch, version), \
            f"inode {st.st_ino} shows {(rel, epoch, version)} after {inodes[st.st_ino]}"
        return st

    held = os.open(m.path("a.jsonl"), os.O_RDONLY)  # keeps the epoch-0 inode of a.jsonl alive
    versions = {"a.jsonl": 0, "b.jsonl": 0, "d/n.npy": 0}
    try:
        for round_ in (0, 1):
            for epoch in (0, 1, 2, 0):
                m.set_epoch(epoch)
                for rel in versions:
                    st, src = look(rel, epoch, versions[rel]), os.stat(m.src / rel)
                    assert st.st_blksize == 1 << 20, rel
                    assert st.st_mtime_ns == src.st_mtime_ns + epoch * 1_000_000_000, rel
                    assert (st.st_mode, st.st_uid, st.st_gid, st.st_nlink, st.st_ctime_ns) == \
                        (src.st_mode, src.st_uid, src.st_gid, src.st_nlink, src.st_ctime_ns), rel
            if round_ == 0:
                assert os.stat(m.path("a.jsonl")).st_ino == os.fstat(held).st_ino  # epoch 0 again, same inode
                tmp = m.src / "b.new"
                tmp.write_bytes(LINES[:30000])
                os.replace(tmp, m.src / "b.jsonl")  # a new version of b
                versions["b.jsonl"] = 1
        assert len(set(inodes.values())) == 3 + 3 + 2 * 3  # every (path, epoch, version) was seen
    finally:
        os.close(held)


def test_shared_mappings_of_direct_io_views_are_enodev_private_ones_work(mount):
    """Holds: SEMANTICS.md#views-pagecache, SEMANTICS.md#errors-enodev"""
    arr = np.arange(3000, dtype="<i8").reshape(1000, 3)
    m = mount({"a.jsonl": LINES, "n.npy": npy_bytes(arr)}, *ARGS, "--direct-io")
    want = read(m.path("a.jsonl"))
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
        assert e.value.errno == errno.ENODEV
        private = mmap.mmap(fd, 0, mmap.MAP_PRIVATE, mmap.PROT_READ)
        try:
            assert private[:] == want
        finally:
            private.close()
    finally:
        os.close(fd)
    fd = os.open(m.path("n.npy"), os.O_RDONLY)
    try:
        shared = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            assert shared[:] == read(m.path("n.npy"))
        finally:
            shared.close()
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- epochs


def test_a_remount_starts_again_at_its_epoch_option(mount):
    """Holds: SEMANTICS.md#epochs-mount"""
    m = mount({"a.jsonl": LINES, "d/b.jsonl": LINES[:30000], "c.jsonl": LINES[:20000]}, *ARGS, "--epoch", "3")
    assert m.xattr("epoch") == m.xattr("epoch", "d") == m.xattr("epoch", "a.jsonl") == "3"
    at3 = {rel: read(m.path(rel)) for rel in ("a.jsonl", "d/b.jsonl", "c.jsonl")}
    m.set_epoch(5)
    m.set_epoch(7, "d")
    m.set_epoch(9, "c.jsonl")
    assert [m.xattr("epoch", p) for p in ("", "a.jsonl", "d/b.jsonl", "c.jsonl")] == ["5", "5", "7", "9"]
    assert read(m.path("c.jsonl")) != at3["c.jsonl"]
    m.stop()
    m.start()  # the same source, cache and options
    assert [m.xattr("epoch", p) for p in ("", "d", "a.jsonl", "d/b.jsonl", "c.jsonl")] == ["3"] * 5
    assert m.stats()["epoch_overrides"] == {}
    assert {rel: read(m.path(rel)) for rel in at3} == at3


def test_an_epoch_set_under_parts_is_the_files_epoch_everywhere(mount):
    """Holds: SEMANTICS.md#epochs-file, SEMANTICS.md#epochs-read"""
    m = mount({"a.jsonl": LINES, "b.jsonl": LINES[:30000]}, *ARGS)
    before = read(m.path("a.jsonl"))
    m.set_epoch(6, ".parts/3/1/a.jsonl")
    for rel in ("a.jsonl", ".parts/3/0/a.jsonl", ".parts/3/2/a.jsonl", ".parts/2/1/a.jsonl"):
        assert m.xattr("epoch", rel) == "6", rel
    assert m.xattr("epoch") == "0" and m.xattr("epoch", "b.jsonl") == "0"
    after = read(m.path("a.jsonl"))
    assert after != before and sorted(after.splitlines()) == sorted(before.splitlines())


def test_pass_through_files_and_links_have_no_epoch(mount):
    """Holds: SEMANTICS.md#epochs-passthrough, SEMANTICS.md#errors-enotsup, SEMANTICS.md#errors-enodata"""
    m = mount({"a.jsonl": LINES, "p.dat": b"plain\n", "d/b.jsonl": LINES[:1000]}, *ARGS)
    os.symlink("a.jsonl", m.src / "link")
    p = m.path("p.dat")
    assert os.listxattr(p) == []
    assert errno_of(lambda: os.getxattr(p, "user.shufflefs.epoch")) == errno.ENODATA
    assert errno_of(lambda: os.setxattr(p, "user.shufflefs.epoch", b"1")) == errno.ENOTSUP
    assert errno_of(lambda: os.getxattr(m.path("link"), "user.shufflefs.epoch", follow_symlinks=False)) == errno.ENODATA
    assert os.listxattr(m.path("d")) == ["user.shufflefs.epoch"]
    assert errno_of(lambda: os.getxattr(m.path("d"), "user.shufflefs.records")) == errno.ENODATA
    assert m.xattr("epoch") == "0" and m.stats()["epoch_overrides"] == {}


def test_a_pool_shards_handle_keeps_its_epoch_and_size_and_an_open_after_a_stat_gets_the_new_epoch(mount):
    """Shard sizes change with the epoch.  Being built: a pooled shard's open handle keeps its
    open's epoch and size.  Holds: SEMANTICS.md#epochs-pool-handle, SEMANTICS.md#epochs-stat-race,
    SEMANTICS.md#views-size"""
    from test_mount_pools import POOL_ARGS, SIZES, pooled_reference, shard_files

    files = shard_files()
    m = mount(files, *POOL_ARGS)
    names = sorted(SIZES)
    refs = {e: pooled_reference(files, names, "stratified", e) for e in range(4)}  # the default
    sizes = {e: [len(v) for v in refs[e]] for e in refs}
    assert len({tuple(s) for s in sizes.values()}) > 1, "the test needs shard sizes that change"
    for i, name in enumerate(names):
        m.set_epoch(0)
        fd = os.open(m.path(name), os.O_RDONLY)
        try:
            head = os.read(fd, 1000)
            for epoch in (1, 2, 3):
                m.set_epoch(epoch)
                assert os.fstat(fd).st_size == sizes[0][i], name
                assert os.stat(m.path(name)).st_size == sizes[epoch][i], name
            rest = b"".join(iter(lambda: os.read(fd, 777), b""))
            assert head + rest == refs[0][i], f"{name}: the handle left its epoch"
            assert os.pread(fd, 100, sizes[0][i] - 50) == refs[0][i][-50:]
        finally:
            os.close(fd)
        # a stat, an epoch change, then an open: the open is of the new epoch
        m.set_epoch(1)
        assert os.stat(m.path(name)).st_size == sizes[1][i]
        m.set_epoch(2)
        fd = os.open(m.path(name), os.O_RDONLY)
        try:
            assert os.fstat(fd).st_size == sizes[2][i]
            assert b"".join(iter(lambda: os.read(fd, 4096), b"")) == refs[2][i]
        finally:
            os.close(fd)
    assert m.stats()["errors"] == 0


# --------------------------------------------------------------------------- changes


def test_pass_through_files_show_what_the_source_holds_now(mount):
    """Holds: SEMANTICS.md#changes-passthrough"""
    m = mount({"p.dat": b"A" * 8192}, *ARGS)
    fd = os.open(m.path("p.dat"), os.O_RDONLY)
    try:
        with open(m.src / "p.dat", "r+b") as f:
            f.write(b"B" * 8192)  # in place, before this handle read anything
        assert os.pread(fd, 8192, 0) == b"B" * 8192
    finally:
        os.close(fd)
    tmp = m.src / "p.new"
    tmp.write_bytes(b"C" * 100)
    os.replace(tmp, m.src / "p.dat")
    assert read(m.path("p.dat")) == b"C" * 100
    assert m.stats()["errors"] == 0


def shift_cached_bounds(cache: Path) -> int:
    """Rewrite every index cache entry whole, with one record bound in the middle moved by a
    byte (the other arrays of the entry kept as they are); returns the entries changed."""
    entries = sorted(cache.rglob("*.npz"))
    for path in entries:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k].copy() for k in z.files}
        bounds = arrays["bounds"]
        assert len(bounds) > 4
        bounds[len(bounds) // 2] += 1
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    return len(entries)


@pytest.mark.parametrize("rel,data", [
    ("a.jsonl", LINES),
    ("n.npy", npy_bytes(np.arange(6000, dtype="<i4").reshape(2000, 3))),
    ("f.bin", bytes(range(256)) * 64),
], ids=["lines", "npy", "fixed"])
def test_a_cache_entry_that_does_not_match_is_eio_or_ignored_then_rebuilt(mount, rel, data):
    """Being built: index caches are hints.  Every read is of the right bytes or EIO naming the
    file and the offset; after an EIO the next open serves the right bytes.
    Holds: SEMANTICS.md#changes-cache, SEMANTICS.md#errors-eio"""
    m = mount({rel: data}, *ARGS, "--format", "*.bin=fixed:record_size=16")
    want = read(m.path(rel))
    m.stop()
    assert shift_cached_bounds(m.cache) == 1
    m.start()
    outcomes = []
    for _ in range(2):
        try:
            got = read(m.path(rel))
        except OSError as e:
            assert e.errno == errno.EIO, e
            outcomes.append("EIO")
            continue
        assert got == want, f"{rel}: bytes of an index that does not match the file"
        outcomes.append("ok")
    assert outcomes[-1] == "ok", outcomes
    if "EIO" in outcomes:
        assert any(rel in line and "offset" in line for line in m.stats()["last_errors"]), m.stats()["last_errors"]


# --------------------------------------------------------------------------- never followed


def test_a_directory_swapped_for_a_link_is_enoent(mount, tmp_path):
    """Being built: a directory swapped for a symbolic link reads as ENOENT (listed, stat'ed or
    opened), never as ESTALE or ELOOP, and nothing is served from where the link points.
    Holds: SEMANTICS.md#never-opened-swapped-dir, SEMANTICS.md#errors-enoent"""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.jsonl").write_bytes(b'{"secret": 1}\n' * 100)
    (outside / "p.dat").write_bytes(b"SECRET\n")
    m = mount({"d/a.jsonl": LINES, "d/p.dat": b"plain\n", "keep.jsonl": LINES[:5000]}, *ARGS)
    assert sorted(os.listdir(m.path("d"))) == ["a.jsonl", "p.dat"]
    assert len(read(m.path("d/a.jsonl"))) == len(LINES) and read(m.path("d/p.dat")) == b"plain\n"
    os.rename(m.src / "d", m.src / "d.old")
    os.symlink(outside, m.src / "d")
    old = {"open d/a.jsonl": LINES, "open d/p.dat": b"plain\n"}
    checks = {
        "open d/a.jsonl": lambda: read(m.path("d/a.jsonl")),
        "open d/p.dat": lambda: read(m.path("d/p.dat")),
        "stat d/a.jsonl": lambda: os.stat(m.path("d/a.jsonl")),
        "list d": lambda: os.listdir(m.path("d")),
        "stat d": lambda: os.stat(m.path("d")),
    }
    start = time.monotonic()
    grace, end = start + 1.5, start + 3.0  # the kernel's and the daemon's one second, and more
    last: dict[str, object] = {}
    while True:
        now = time.monotonic()
        for what, fn in checks.items():
            try:
                got = fn()
            except OSError as e:
                assert e.errno == errno.ENOENT, f"{what}: {errno.errorcode.get(e.errno, e.errno)}"
                last[what] = errno.ENOENT
                continue
            assert now < grace, f"{what} still answered {now - start:.1f} s after the swap"
            if what in old:  # what the directory held before, never what the link points to
                assert sorted(got.splitlines()) == sorted(old[what].splitlines()), what
            last[what] = got
        if now > end:
            break
        time.sleep(0.05)
    assert all(code == errno.ENOENT for code in last.values()), last
    assert errno_of(lambda: os.lstat(m.path("d"))) == errno.ENOENT  # the link leaves the source
    assert "d" not in os.listdir(m.mnt)
    assert sorted(read(m.path("keep.jsonl")).splitlines()) == sorted(LINES[:5000].splitlines())


# --------------------------------------------------------------------------- deadlines and faults


HUNG_CALLS = """
import os, sys, threading
mnt = sys.argv[1]
fd = os.open(os.path.join(mnt, "big.dat"), os.O_RDONLY)
assert len(os.pread(fd, 4096, 0)) == 4096
print("opened", flush=True)
sys.stdin.readline()  # the source hangs from here on
out = {}
def call(what, fn):
    try:
        fn()
        out[what] = "ok"
    except OSError as e:
        out[what] = e.errno
calls = {
    "pread": lambda: os.pread(fd, 4096, 3 << 20),
    "list": lambda: os.listdir(os.path.join(mnt, "d")),
    "open": lambda: os.open(os.path.join(mnt, "d", "never.jsonl"), os.O_RDONLY),
}
ts = [threading.Thread(target=call, args=item) for item in calls.items()]
[t.start() for t in ts]
[t.join() for t in ts]
print(" ".join(f"{k}={v}" for k, v in sorted(out.items())), flush=True)
"""


def test_calls_on_a_hung_source_end_in_etimedout_and_the_mount_answers(mount):
    """The source of ``outer`` is the mount ``inner``, whose daemon is stopped: a pass-through
    read through a handle opened before, a listing and a lookup of ``outer`` each end with
    ETIMEDOUT at their deadline (not a hang), and ``outer`` still answers what needs no source.
    Being built: every blocking call of the daemon has a deadline.
    Holds: SEMANTICS.md#deadlines-source, SEMANTICS.md#errors-etimedout"""
    inner = mount({"big.dat": os.urandom(4 << 20), "d/a.jsonl": LINES}, "--format", "*=none", name="inner")
    outer = mount(None, src=inner.mnt, name="outer")
    child = subprocess.Popen([sys.executable, "-c", HUNG_CALLS, str(outer.mnt)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        assert child.stdout.readline().strip() == "opened", child.stderr.read()
        os.kill(inner.pid, signal.SIGSTOP)
        stopped = True
        try:
            out, err = child.communicate("go\n", timeout=CAP)
        except subprocess.TimeoutExpired:
            pytest.fail(f"calls on a hung source did not return within {CAP:g} s")
        got = dict(item.split("=") for item in out.split())
        assert got == {k: str(errno.ETIMEDOUT) for k in ("list", "open", "pread")}, (out, err)
        r = bounded("import os, sys; print(os.getxattr(sys.argv[1], 'user.shufflefs.pid').decode())",
                    str(outer.mnt), mnt=outer.mnt, timeout=30)
        assert r.stdout.strip() == str(outer.pid)
        assert "big.dat" in outer.stderr() or "d/never.jsonl" in outer.stderr()
    finally:
        if child.poll() is None:
            control.abort(str(outer.mnt))
            child.kill()
            child.communicate(timeout=30)
        if stopped:
            os.kill(inner.pid, signal.SIGCONT)


def test_a_killed_daemon_leaves_enotconn_until_umount(mount):
    """Holds: SEMANTICS.md#errors-enotconn, SEMANTICS.md#umount-killed"""
    m = mount({"a.jsonl": LINES}, *ARGS)
    first = read(m.path("a.jsonl"))
    os.kill(m.pid, signal.SIGKILL)
    m.wait()
    assert is_mounted(m.mnt)
    for fn in (lambda: os.stat(m.path("a.jsonl")), lambda: os.listdir(m.mnt), lambda: read(m.path("a.jsonl"))):
        assert errno_of(fn) == errno.ENOTCONN
    r = shufflefs("umount", m.mnt)
    assert r.returncode == 0, r.stderr
    assert not is_mounted(m.mnt)
    m.start()  # the same cache directory
    assert read(m.path("a.jsonl")) == first


def test_stat_and_epoch_give_up_on_a_stopped_daemon(mount):
    """Holds: SEMANTICS.md#deadlines-cli"""
    m = mount({"a.jsonl": LINES}, *ARGS)
    os.kill(m.pid, signal.SIGSTOP)
    try:
        for args in (("stat", m.mnt), ("epoch", m.mnt), ("epoch", m.mnt, "3")):
            r = shufflefs(*args, timeout=60)
            assert r.returncode != 0 and "no answer" in r.stderr, (args, r.stderr)
    finally:
        os.kill(m.pid, signal.SIGCONT)
    assert m.xattr("epoch") == "0"  # the refused change was never made


# --------------------------------------------------------------------------- memory


def test_closed_views_stay_idle_up_to_four(mount):
    """Holds: SEMANTICS.md#memory-idle, SEMANTICS.md#memory-windows"""
    names = [f"f{i}.jsonl" for i in range(6)]
    m = mount({n: LINES[: 20000 + 1000 * i] for i, n in enumerate(names)}, *ARGS)
    for i, name in enumerate(names):
        assert sorted(read(m.path(name)).splitlines()) == sorted(LINES[: 20000 + 1000 * i].splitlines())
        stats = m.stats()
        assert stats["views"] == 0 and stats["idle_views"] == min(i + 1, 4), stats
        memory = stats["memory"]
        assert memory["window_bytes"] + memory["pooled_bytes"] <= memory["limit_bytes"]
    loads = m.stats()["memory"]["loads"]
    assert read(m.path(names[-1]))  # still idle with its windows: read without a load
    assert m.stats()["memory"]["loads"] == loads
