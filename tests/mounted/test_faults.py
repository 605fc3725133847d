"""Level: mounted (real FUSE mounts, real readers).

Mounted: the fault matrix: a daemon stopped, killed or left without its source, and the
commands a user runs then (``shufflefs umount``, ``stat``, a remount).  Nothing may hang, and
nothing may be left mounted.  ``--stress`` repeats the kill-and-remount rounds."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import REPO, is_mounted

LINES = b"".join(b'{"id": %06d}\n' % i for i in range(20000))
CLI_TIMEOUT = 60  # a generous cap so that a hang fails the test instead of the whole run


def shufflefs(*args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shufflefs", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_umount_of_a_stopped_daemon_returns_and_removes_the_mount(mount):
    """Holds: SEMANTICS.md#umount-stuck, SEMANTICS.md#deadlines-cli"""
    m = mount({"a.jsonl": LINES})
    assert sorted(open(m.path("a.jsonl"), "rb").read().splitlines()) == sorted(LINES.splitlines())
    os.kill(m.pid, signal.SIGSTOP)
    try:
        r = shufflefs("stat", str(m.mnt))
        assert r.returncode != 0 and "no answer" in r.stderr, r.stderr
        r = shufflefs("umount", str(m.mnt))
        assert r.returncode == 0, r.stderr
        assert not is_mounted(m.mnt)
    finally:
        os.kill(m.pid, signal.SIGCONT)
    m.wait()  # the daemon notices the unmount once it runs again


def test_umount_after_the_source_was_removed(mount):
    """Holds: SEMANTICS.md#umount-stuck"""
    m = mount({"d/a.jsonl": LINES})
    assert len(open(m.path("d/a.jsonl"), "rb").read()) == len(LINES)
    shutil.rmtree(m.src)
    r = shufflefs("umount", str(m.mnt))
    assert r.returncode == 0, r.stderr
    assert not is_mounted(m.mnt)
    assert m.wait() == 0


def test_kill_9_then_a_remount_serves_the_same_views(mount, stress):
    """Holds: SEMANTICS.md#umount-killed, SEMANTICS.md#views-order"""
    m = mount({"a.jsonl": LINES, "b.jsonl": LINES[: len(LINES) // 3]})
    first = open(m.path("a.jsonl"), "rb").read()
    for round_ in range(5 if stress else 1):
        os.kill(m.pid, signal.SIGKILL)
        m.wait()
        r = shufflefs("umount", str(m.mnt))  # the kernel mount outlives its daemon
        assert r.returncode == 0, r.stderr
        assert not is_mounted(m.mnt)
        m = mount(None, "--cache-dir", str(m.cache), src=m.src, name=f"again{round_}")
        assert open(m.path("a.jsonl"), "rb").read() == first
        assert sorted(open(m.path("b.jsonl"), "rb").read().splitlines()) == sorted(LINES[: len(LINES) // 3].splitlines())
    leftovers = [p for p in Path(m.cache).rglob("*.tmp")]
    assert not leftovers


def test_umount_of_a_path_that_is_not_mounted_fails_clearly(tmp_path):
    r = shufflefs("umount", str(tmp_path))
    assert r.returncode == 1 and "not mounted" in r.stderr
    r = shufflefs("umount", str(tmp_path / "nope"))
    assert r.returncode == 1 and "no such file" in r.stderr


def test_a_daemon_killed_while_indexing_leaves_nothing_the_next_one_keeps(mount, tmp_path):
    m = mount({"a.jsonl": LINES})
    tmp = Path(tempfile.gettempdir())  # the daemons' (conftest gives them a private one)
    run = tmp / f"shufflefs-{m.pid}"
    assert run.is_dir()  # the daemon's own temporary directory (multiprocessing's files too)
    # what a daemon killed in the middle of writing would leave: a temporary index and its folder
    dead = 2**22 + 12345  # beyond pid_max on this machine's defaults: never a live process
    (Path(m.cache) / "ab").mkdir(parents=True, exist_ok=True)
    stale_tmp = Path(m.cache) / "ab" / f"{dead}-x.tmp"
    stale_tmp.write_bytes(b"half an index")
    stale_run = tmp / f"shufflefs-{dead}"
    (stale_run / "pymp-xyz").mkdir(parents=True)
    assert open(m.path("a.jsonl"), "rb").read()  # builds and caches the index
    os.kill(m.pid, signal.SIGKILL)
    m.wait()
    shufflefs("umount", str(m.mnt))
    again = mount(None, "--cache-dir", str(m.cache), src=m.src, name="again")
    assert not stale_tmp.exists() and not stale_run.exists() and not run.exists()
    assert sorted(open(again.path("a.jsonl"), "rb").read().splitlines()) == sorted(LINES.splitlines())
    own = tmp / f"shufflefs-{again.pid}"
    assert own.is_dir()
    again.stop()
    assert not own.exists()


def test_sigterm_ends_a_daemon_whose_source_hangs(mount):
    """The source of ``outer`` is the mount ``inner``; with ``inner``'s daemon stopped every read
    of the source hangs (as on a dead network filesystem).  SIGTERM must still end ``outer``.
    Holds: SEMANTICS.md#umount-signals"""
    inner = mount({"a.jsonl": LINES, "b.jsonl": LINES}, "--format", "*=none", name="inner")  # plain files
    outer = mount(None, src=inner.mnt, name="outer")
    assert sorted(open(outer.path("a.jsonl"), "rb").read().splitlines()) == sorted(LINES.splitlines())
    os.kill(inner.pid, signal.SIGSTOP)
    reader = subprocess.Popen([sys.executable, "-c", f"open({str(outer.path('b.jsonl'))!r}, 'rb').read()"])
    try:
        time.sleep(1.0)  # the reader is now waiting on outer, which waits on the stopped inner
        assert reader.poll() is None
        os.kill(outer.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while is_mounted(outer.mnt) and time.monotonic() < deadline:  # the watchdog detaches it
            time.sleep(0.1)
        assert not is_mounted(outer.mnt)
        # the process has begun to exit; closing its files of the stopped source waits for that
        # daemon like any process's would (the kernel's FUSE flush), so it finishes once inner runs
    finally:
        os.kill(inner.pid, signal.SIGCONT)
        reader.kill()
        reader.wait()
    assert outer.wait(timeout=30) != 0


def test_a_full_cache_disk_still_serves_correct_views(mount, tmp_path):
    cache = tmp_path / "tiny-cache"
    cache.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(cache)], capture_output=True)
    if r.returncode != 0:
        import pytest

        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        fd = os.open(cache / "filler", os.O_WRONLY | os.O_CREAT)  # fill it up
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        m = mount({"a.jsonl": LINES}, "--cache-dir", str(cache))
        for epoch in (0, 1):
            m.set_epoch(epoch)
            assert sorted(open(m.path("a.jsonl"), "rb").read().splitlines()) == sorted(LINES.splitlines())
        assert "cannot write index cache" in m.stderr()
        m.stop()
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True)


def test_other_files_are_served_while_a_large_view_is_prepared(mount):
    """A large file's first open (index scan and an O(records) plan on worker threads and
    processes) must not hold up a listing or another file: both complete while it is pending."""
    import numpy as np

    n = 6_000_000
    big = np.full((n, 8), ord("x"), np.uint8)
    big[:, -1] = ord("\n")
    m = mount({"small.jsonl": LINES, "d/big.txt": big.tobytes()}, "--strategy", "full", "--world-size", "2")
    order: list[str] = []

    def open_big() -> None:
        with open(m.path("d/big.txt"), "rb") as f:
            f.read(1)
        order.append("big")

    import threading

    t = threading.Thread(target=open_big)
    t.start()
    time.sleep(0.05)  # the big open is on its way (its lookup sizes the rank's share from its plan)
    assert sorted(os.listdir(m.path(""))) == ["d", "small.jsonl"]  # (a listing of d/ needs big's size)
    order.append("list")
    data = open(m.path("small.jsonl"), "rb").read()
    order.append("small")
    t.join(120)
    assert len(data.splitlines()) == len(LINES.splitlines()) // 2
    assert order == ["list", "small", "big"], order
