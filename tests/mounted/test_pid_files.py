"""Level: mounted (real FUSE mounts, daemons killed with SIGKILL).

A daemon's pid file (in the run directory, ``/run/shufflefs`` for root) lets ``shufflefs umount``
find it without asking the mount.  A killed daemon cannot remove its own: ``shufflefs umount`` of
its dead mount removes it, and so does the next daemon to start, so killed daemons leave nothing
behind in the run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO, process_gone, wait_for

from shufflefs.fs import control

FILES = {"a.jsonl": b"".join(b'{"i": %d}\n' % i for i in range(500))}


def names_pid(path: Path, pid: int) -> bool:
    try:
        return json.loads(path.read_text())["pid"] == pid
    except (OSError, ValueError, KeyError):
        return False


def kill(m) -> Path:
    pid_file = Path(control.pid_file(str(m.mnt)))
    wait_for(lambda: names_pid(pid_file, m.pid), "the daemon's pid file")  # written just after mounting
    os.kill(m.pid, signal.SIGKILL)
    wait_for(lambda: process_gone(m.pid), "the killed daemon to be gone")
    assert names_pid(pid_file, m.pid)  # nothing could remove it
    return pid_file


def test_pid_files_of_killed_daemons_are_removed_by_umount_and_by_the_next_daemon(mount):
    """Holds: SEMANTICS.md#umount-killed"""
    first = mount(FILES)
    stale = kill(first)
    r = subprocess.run([sys.executable, "-m", "shufflefs", "umount", str(first.mnt)], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert not stale.exists()

    second = mount(FILES)
    stale = kill(second)
    subprocess.run(["fusermount3", "-u", "-z", str(second.mnt)], capture_output=True, timeout=30)
    third = mount(FILES)  # any mount: it removes what dead daemons left
    assert not stale.exists()
    own = Path(control.pid_file(str(third.mnt)))
    wait_for(lambda: names_pid(own, third.pid), "the daemon's pid file")
    third.stop()
    assert third.returncode == 0 and not own.exists()
