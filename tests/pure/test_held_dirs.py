"""Level: pure (no mount).

`scratch.held` directories: removed by the next holder once their process is gone however it
ended, never while it runs, never another user's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shufflefs import scratch

REPO = Path(__file__).resolve().parents[2]
PREFIX = "shufflefs-stage-"
HOLD = ("import sys, time; sys.path.insert(0, sys.argv[1]); from shufflefs import scratch; "
        "path, fd = scratch.held(sys.argv[2], sys.argv[3]); open(path + '/x.stage', 'w').write('x'); "
        "print(path, flush=True); time.sleep(600)")


def holder(root: Path) -> tuple[subprocess.Popen, Path]:
    """A process holding a new directory under ``root`` until it is killed."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(REPO), str(root), PREFIX], stdout=subprocess.PIPE, text=True)
    return p, Path(p.stdout.readline().strip())


def test_a_held_directory_stays_while_its_holder_runs_and_goes_after_a_kill(tmp_path):
    procs = [holder(tmp_path) for _ in range(2)]
    try:
        (p1, d1), (p2, d2) = procs
        assert d1.name.startswith(f"{PREFIX}{p1.pid}-") and (d1 / "x.stage").exists()
        assert scratch.remove_unheld(tmp_path, PREFIX) == 0
        os.kill(p1.pid, signal.SIGKILL)
        p1.wait()
        own, fd = scratch.held(tmp_path, PREFIX)
        assert not d1.exists() and (d2 / "x.stage").exists() and os.path.isdir(own)
        assert scratch.remove_unheld(tmp_path, PREFIX) == 0  # this process's own stays too
        os.close(fd)
        assert scratch.remove_unheld(tmp_path, PREFIX) == 1 and not os.path.exists(own)
        assert (d2 / "x.stage").exists()
    finally:
        for p, _ in procs:
            p.kill()
            p.wait()


def test_half_made_directories_go_by_their_pid_and_others_stay(tmp_path):
    dead = 2**22 + 12345  # beyond pid_max on this machine's defaults: never a live process
    half_dead = tmp_path / f".{PREFIX}{dead}-abc"
    half_live = tmp_path / f".{PREFIX}{os.getpid()}-abc"
    unrelated = tmp_path / "shufflefs-other"
    for d in (half_dead, half_live, unrelated):
        d.mkdir()
    (tmp_path / f"{PREFIX}file").write_text("not a directory")
    assert scratch.remove_unheld(tmp_path, PREFIX) == 1
    assert not half_dead.exists() and half_live.exists() and unrelated.exists()
    assert (tmp_path / f"{PREFIX}file").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_directory_stays(tmp_path):
    theirs = tmp_path / f"{PREFIX}1-abc"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    assert scratch.remove_unheld(tmp_path, PREFIX) == 0 and theirs.exists()


def test_unlocked_directories_of_older_versions_stay(tmp_path):
    """Named without a pid: made by a version that held no lock, whose daemon may still run."""
    old = tmp_path / f"{PREFIX}o2uvkz2m"
    old.mkdir()
    assert scratch.remove_unheld(tmp_path, PREFIX) == 0 and old.exists()
