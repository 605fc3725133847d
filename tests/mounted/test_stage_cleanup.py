"""Level: mounted (real FUSE mounts, real readers).

The stages of a mount killed with SIGKILL do not stay on the local disk: the next mount of the
same ``--stage-dir`` removes them, never a live mount's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from test_mount import read
from test_mount_stage import ARGS, FILES, wait_for


def staged(m) -> tuple[Path, list[str]]:
    """Wait until ``m`` has built its stages (epoch 0's and 1's); its stage directory and files."""
    assert read(m.path("a.jsonl"))
    wait_for(lambda: {s["epoch"] for s in m.stats()["staging"]["stages"]} == {0, 1})
    d = Path(m.stats()["staging"]["dir"])
    return d, sorted(os.listdir(d))


def test_a_killed_mounts_stages_go_with_the_next_mount_and_a_live_ones_stay(mount, tmp_path):
    stage = tmp_path / "stage"
    killed = mount(FILES, *ARGS, "--stage-dir", str(stage), name="killed")
    live = mount(None, *ARGS, "--stage-dir", str(stage), src=killed.src, name="live")
    (killed_dir, killed_files), (live_dir, live_files) = staged(killed), staged(live)
    assert killed_files and live_files and sorted(stage.iterdir()) == sorted([killed_dir, live_dir])
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert sorted(os.listdir(killed_dir)) == killed_files  # the kill left them
    r = subprocess.run([sys.executable, "-m", "shufflefs", "umount", str(killed.mnt)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert r.returncode == 0, r.stderr

    after = mount(None, *ARGS, "--stage-dir", str(stage), src=killed.src, name="after")
    after_dir = Path(after.stats()["staging"]["dir"])
    assert not killed_dir.exists()
    assert sorted(os.listdir(live_dir)) == live_files  # a live mount's stages stay
    assert sorted(stage.iterdir()) == sorted([live_dir, after_dir])
    assert read(live.path("a.jsonl")) == read(after.path("a.jsonl"))
    for m in (live, after):
        m.stop()
        assert m.returncode == 0, m.stderr()
    assert os.listdir(stage) == []
