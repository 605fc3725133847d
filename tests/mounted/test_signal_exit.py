"""Level: mounted (real FUSE mounts, real readers).

A daemon stopped by SIGTERM in the middle of a long index build exits at once and cleanly: the
open waiting on the scan fails, the indexing processes end, and nothing is left behind (no
temporary directory, no semaphores for multiprocessing's resource tracker to report)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import process_gone, wait_for
from test_indexer import _children, _cmdline, _workers

from shufflefs.fs.daemon import EXIT_GRACE, is_mounted

LINES = 100_000_000
"""8-byte lines: an 800 MB file whose scan takes seconds (and whose index 800 MB)."""


def test_sigterm_during_an_index_build_exits_at_once_and_leaves_nothing(mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    big = src / "big.jsonl"
    np.tile(np.frombuffer(b'{"a":1}\n', np.uint8), LINES).tofile(big)
    reader = None
    try:
        m = mount(None, "-v", src=src)
        reader = subprocess.Popen(["head", "-c", "10", str(m.path("big.jsonl"))],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _workers(m.pid), "an indexing process")
        time.sleep(0.3)
        if "index of big.jsonl" in m.stderr():
            pytest.skip("the scan ended before the signal")
        helpers = _children(m.pid)
        helpers += [w for h in helpers for w in _children(h)]
        assert any("resource_tracker" in _cmdline(h) for h in helpers)
        t0 = time.monotonic()
        os.kill(m.pid, signal.SIGTERM)
        code = m.wait(timeout=30)
        took = time.monotonic() - t0
        wait_for(lambda: all(process_gone(h) for h in helpers), "the daemon's processes to end")
        log = m.stderr()
        assert code == 0 and took < EXIT_GRACE, log
        assert "still running" not in log and "leaked" not in log and "Traceback" not in log, log
        assert "index of big.jsonl" not in log  # it really was stopped in the middle
        assert not (Path(tempfile.gettempdir()) / f"shufflefs-{m.pid}").exists()
        assert not m.mnt.is_mount()
        assert reader.wait(timeout=30) != 0
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        big.unlink()


def test_sigterm_while_a_reader_holds_a_served_handle_unmounts_cleanly(mount, tmp_path):
    """A handle whose reads the compiled replies answered is released at shutdown outside the
    event loop: the release must not need the loop (it raised there, the shutdown stopped half
    way, and the daemon exited 1 without unmounting or keeping its copies).
    Holds: SEMANTICS.md#umount-signals"""
    if not __import__("shufflefs.replies", fromlist=["compiled"]).compiled:
        pytest.skip("compiled replies not built")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_bytes(b"".join(b'{"i": %d, "pad": "%s"}\n' % (i, b"x" * (i % 50))
                                           for i in range(20_000)))
    m = mount(None, "-v", "--block-size", "64KiB", "--buffer", "1MiB", src=src)
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        for _ in range(8):  # sequential reads, answered in C once the window is offered
            assert os.read(fd, 4096)
        assert m.stats()["compiled_replies"]["replies"] > 0
        os.kill(m.pid, signal.SIGTERM)
        code = m.wait(timeout=30)
        log = m.stderr()
        assert code == 0 and "Traceback" not in log, log
        assert f"unmounted {m.mnt}" in log, log
        assert not is_mounted(m.mnt)
    finally:
        with contextlib.suppress(OSError):  # ENOTCONN: no daemon answers its flush
            os.close(fd)
