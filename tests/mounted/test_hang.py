"""Level: mounted (real FUSE mounts, real readers).

Nothing under the source can hang the mount: a FIFO, socket or device that appears under a
name is refused without being opened, calls on a hung source end in ``ETIMEDOUT`` at their
deadline while the mount goes on answering, and ``shufflefs umount`` never waits on a request
through the mount.  Holds: SEMANTICS.md#never-opened, SEMANTICS.md#deadlines,
SEMANTICS.md#umount.

A test that would hang without the fix ends the FUSE connection itself (`bounded`), so a
regression fails the test instead of stalling the run."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, bounded, is_mounted

from shufflefs.fs import control
from shufflefs.serve.workers import META_DEADLINE

LINES = b"".join(b'{"id": %06d}\n' % i for i in range(5000))


OPEN_READ = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
    os.read(fd, 100)
    print("read")
except OSError as e:
    print("errno", e.errno)
"""


def shufflefs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shufflefs", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def swap_for_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", ["blob.bin", "a.jsonl"])
def test_a_fifo_swapped_in_after_lookup_is_refused_and_the_mount_stays_responsive(mount, name):
    """Holds: SEMANTICS.md#never-opened, SEMANTICS.md#errors-enxio, SEMANTICS.md#never-opened-special"""
    m = mount({"blob.bin": b"x" * 5000, "a.jsonl": LINES, "b.jsonl": LINES})
    os.stat(m.path(name))  # looked up as a regular file
    swap_for_fifo(m.src / name)
    # more opens than the daemon has metadata workers: none may sit on one
    results = [bounded(OPEN_READ, str(m.path(name)), mnt=m.mnt) for _ in range(10)]
    for r in results:
        assert r.stdout.split()[:1] == ["errno"], (r.stdout, r.stderr)
        assert int(r.stdout.split()[1]) in (errno.ENXIO, errno.EIO, errno.ENOENT, errno.ESTALE), r.stdout
    r = bounded("import os, sys; print(len(os.listdir(sys.argv[1])))", str(m.mnt), mnt=m.mnt)
    assert r.stdout.strip() == "2"  # the FIFO is not listed
    assert sorted(open(m.path("b.jsonl"), "rb").read().splitlines()) == sorted(LINES.splitlines())
    if any(r.stdout.split()[1] == str(errno.ENXIO) for r in results):  # the open saw the FIFO
        assert "FIFO" in m.stderr() and name in m.stderr()
    r = shufflefs("umount", str(m.mnt), timeout=30)
    assert r.returncode == 0, r.stderr
    assert not is_mounted(m.mnt)


def test_fifos_sockets_and_links_in_the_source_are_never_opened(mount):
    """Holds: SEMANTICS.md#never-opened, SEMANTICS.md#tree-hidden, SEMANTICS.md#never-opened-special"""
    m = mount({"a.jsonl": LINES})
    os.mkfifo(m.src / "f.jsonl")
    os.mkfifo(m.src / "g.bin")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(m.src / "s.jsonl"))
        names = bounded("import os, sys; print(sorted(os.listdir(sys.argv[1])))", str(m.mnt), mnt=m.mnt)
        assert names.stdout.strip() == "['a.jsonl']"  # special files are not shown
        for name in ("f.jsonl", "g.bin", "s.jsonl"):
            r = bounded(OPEN_READ, str(m.path(name)), mnt=m.mnt)
            assert r.stdout.split() == ["errno", str(errno.ENOENT)], (name, r.stdout, r.stderr)
    finally:
        s.close()


@pytest.mark.parametrize("name", ["blob.bin", "a.jsonl"])
def test_an_entry_swapped_for_a_fifo_between_lookup_and_open_is_enxio(tmp_path, name):
    """The kernel may look a name up again before opening it (then it is simply gone); the
    catalog is driven directly here, so that the open always comes after the lookup.
    Holds: SEMANTICS.md#never-opened, SEMANTICS.md#errors-enxio, SEMANTICS.md#never-opened-special"""
    import trio

    from shufflefs.config import MountConfig
    from shufflefs.serve.catalog import Catalog
    from shufflefs.serve.nodes import ROOT, Reply
    from shufflefs.strategies import ShuffleSpec

    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(b"x" * 5000)
    (src / "a.jsonl").write_bytes(LINES)
    cfg = MountConfig(src, tmp_path / "mnt", spec=ShuffleSpec(strategy="corgipile"), cache_dir=tmp_path / "cache")

    async def main() -> int:
        cat = Catalog(cfg)
        try:
            async with trio.open_nursery() as nursery:
                cat.start(nursery)
                node = await cat.lookup(cat.tree.nodes[ROOT], name)
                swap_for_fifo(src / name)
                with trio.fail_after(10):  # without the check, the open blocks for ever
                    with pytest.raises(Reply) as e:
                        await cat.open(node)
                nursery.cancel_scope.cancel()
            return e.value.errno
        finally:
            cat.stopping()
            cat.shutdown()

    assert trio.run(main) == errno.ENXIO


def test_the_resolver_refuses_special_files_without_blocking(tmp_path):
    """Holds: SEMANTICS.md#never-opened, SEMANTICS.md#never-opened-special"""
    from shufflefs import resolve

    os.mkfifo(tmp_path / "fifo")
    resolve.confine(tmp_path)
    try:
        with pytest.raises(OSError) as e:
            resolve.open_path(tmp_path / "fifo")  # would block for ever without O_PATH first
        assert e.value.errno == errno.ENXIO and "FIFO" in str(e.value)
        with pytest.raises(OSError) as e:
            resolve.open_path("/dev/null")  # outside the root: checked all the same
        assert e.value.errno == errno.ENXIO and "character device" in str(e.value)
        (tmp_path / "f").write_bytes(b"abc")
        fd = resolve.open_path(tmp_path / "f")
        try:
            assert os.read(fd, 3) == b"abc" and os.get_blocking(fd)
        finally:
            os.close(fd)
    finally:
        resolve.release(tmp_path)


@pytest.fixture
def hung_source(mount):
    """A mount whose source is another shufflefs mount, whose daemon is then stopped: every call
    the outer daemon makes on its source blocks, as on a dead network filesystem."""
    inner = mount({"d/a.jsonl": LINES, "top.bin": LINES}, "--strategy", "none", name="inner")
    outer = mount(None, "--strategy", "none", src=inner.mnt, name="outer")
    assert open(outer.path("top.bin"), "rb").read() == LINES  # passed through: read by preads
    os.kill(inner.pid, signal.SIGSTOP)
    try:
        yield inner, outer
    finally:
        control.abort(str(inner.mnt))  # every call stuck on it returns
        os.kill(inner.pid, signal.SIGCONT)


def test_calls_on_a_hung_source_end_at_their_deadline_and_the_mount_answers_meanwhile(hung_source):
    """The kernel sends the lookups of one directory one at a time, so three of them take up to
    three deadlines; the mount's own attributes are answered meanwhile.
    Holds: SEMANTICS.md#deadlines, SEMANTICS.md#deadlines-source, SEMANTICS.md#errors-etimedout"""
    inner, outer = hung_source
    code = """
import os, sys, threading
res = []
def look(i):
    try:
        os.stat(os.path.join(sys.argv[1], f"x{i}.jsonl"))
        res.append("ok")
    except OSError as e:
        res.append(e.errno)
ts = [threading.Thread(target=look, args=(i,)) for i in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
print(" ".join(map(str, res)))
"""
    child = subprocess.Popen([sys.executable, "-c", code, str(outer.mnt)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        assert child.poll() is None  # stuck on the hung source
        # the kernel asks the root's attributes first: answered from the last ones known once
        # the source's stat times out
        r = bounded("import os, sys; print(os.getxattr(sys.argv[1], 'user.shufflefs.epoch').decode())",
                    str(outer.mnt), mnt=outer.mnt, timeout=META_DEADLINE + 10)
        assert r.stdout.strip() == "0"
        out, err = child.communicate(timeout=META_DEADLINE * 3 + 30)
    finally:
        if child.poll() is None:
            control.abort(str(outer.mnt))
            child.kill()
            child.communicate()
    assert out.split() == [str(errno.ETIMEDOUT)] * 3, (out, err)
    assert "no answer within" in outer.stderr()


def test_a_full_worker_pool_of_stuck_calls_still_lets_new_requests_through(tmp_path):
    """Calls past their deadline give their place back: once a pool's worth of them is stuck,
    a call on a healthy path still runs at once.  Holds: SEMANTICS.md#deadlines, SEMANTICS.md#deadlines-source"""
    import threading

    import trio

    from shufflefs.serve.workers import Timeout, Workers

    release = threading.Event()
    workers = Workers(meta_deadline=0.3)

    async def main() -> list:
        got: list = []

        async def stuck() -> None:
            try:
                await workers.run(release.wait)
                got.append("returned")
            except Timeout as e:
                got.append(e.errno)

        async with trio.open_nursery() as nursery:
            for _ in range(12):  # more than the 8 metadata workers
                nursery.start_soon(stuck)
        assert workers.stuck == 8  # the threads that ran; the other calls never got one
        with trio.fail_after(1.0):  # the pool is free again although every thread still waits
            assert await workers.run(lambda: 42) == 42
        return got

    try:
        got = trio.run(main)
    finally:
        release.set()
    assert got == [errno.ETIMEDOUT] * 12
    deadline = time.monotonic() + 5
    while workers.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers.stuck == 0  # counted down as the threads returned


def test_umount_returns_within_its_deadline_when_requests_hang(mount):
    """Holds: SEMANTICS.md#umount, SEMANTICS.md#umount-stuck"""
    m = mount({"a.jsonl": LINES})
    os.kill(m.pid, signal.SIGSTOP)  # every request through the mount now waits
    stuck = subprocess.Popen([sys.executable, "-c", "import os, sys; os.listdir(sys.argv[1])", str(m.mnt)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        assert stuck.poll() is None  # waiting on the stopped daemon: the mount is busy
        start = time.monotonic()
        r = shufflefs("umount", str(m.mnt), timeout=60)
        took = time.monotonic() - start
        assert r.returncode == 0, r.stderr
        assert "unanswered" in r.stderr
        assert took < 20, took
        assert not is_mounted(m.mnt)
        assert stuck.wait(10) != 0  # its call failed (ENOTCONN) instead of waiting for ever
        m.wait(10)  # the daemon was ended
    finally:
        if stuck.poll() is None:
            control.abort(str(m.mnt))
            stuck.kill()
        try:
            os.kill(m.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_umount_finds_the_daemon_by_its_pid_file(mount):
    """Holds: SEMANTICS.md#umount, SEMANTICS.md#umount-stuck"""
    m = mount({"a.jsonl": LINES})
    deadline = time.monotonic() + 10  # written once the mount is up: the mount can be seen first
    while control.daemon_pid(str(m.mnt)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.daemon_pid(str(m.mnt)) == m.pid
    pid_file = Path(control.pid_file(str(m.mnt)))
    assert pid_file.is_file()
    r = shufflefs("umount", str(m.mnt))
    assert r.returncode == 0, r.stderr
    assert m.wait(10) == 0
    assert not pid_file.exists()


def test_umount_of_a_busy_mount_whose_daemon_answers_leaves_it_alone(mount):
    """Readers that keep requests in flight all the time make a mount busy, not hung: the
    daemon goes on answering, so `shufflefs umount` refuses (naming --lazy) and the readers
    finish.  Holds: SEMANTICS.md#umount-busy"""
    m = mount({"a.jsonl": LINES * 40}, "--direct-io", "--buffer", "64KiB", "--block-size", "4KiB")
    code = """
import os, sys, threading, time
path, stop = sys.argv[1], time.monotonic() + float(sys.argv[2])
def read():
    while time.monotonic() < stop:
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.read(fd, 1 << 16):
                pass
        finally:
            os.close(fd)
ts = [threading.Thread(target=read) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("done")
"""
    readers = subprocess.Popen([sys.executable, "-c", code, str(m.path("a.jsonl")), "12"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        r = shufflefs("umount", str(m.mnt), timeout=60)
        assert r.returncode != 0 and "--lazy" in r.stderr, r.stderr
        assert is_mounted(m.mnt) and m.proc.poll() is None
        out, err = readers.communicate(timeout=60)
        assert out.strip() == "done", err
    finally:
        if readers.poll() is None:
            readers.kill()
            readers.communicate()
