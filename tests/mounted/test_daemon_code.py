"""Level: mounted (real FUSE mounts, real readers).

The daemon runs the code of the ``shufflefs`` command that started it, never a ``shufflefs/``
folder in the working directory (``python -m`` puts the cwd first on ``sys.path``: a checkout
without its compiled gather would serve several times slower), and ``shufflefs stat`` says which
gather serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import shufflefs
from conftest import is_mounted


def test_a_decoy_package_in_the_working_directory_is_not_imported(tmp_path: Path) -> None:
    decoy = tmp_path / "work"
    (decoy / "shufflefs").mkdir(parents=True)
    marker = tmp_path / "decoy-imported"
    (decoy / "shufflefs" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (decoy / "shufflefs" / "__main__.py").write_text("raise SystemExit(97)\n")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "a.jsonl").write_bytes(b"".join(b'{"i": %d}\n' % i for i in range(500)))
    # the command as users run it: the console script, from the folder holding the decoy
    script = Path(sys.executable).with_name("shufflefs")
    cli = [str(script)] if script.exists() else [sys.executable, "-c", "from shufflefs.cli import main; main()"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(shufflefs.__file__).resolve().parents[1])
    r = subprocess.run([*cli, "mount", str(src), str(mnt), "--cache-dir", str(tmp_path / "cache")], cwd=decoy,
                       env=env, capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        assert Path(stats["code"]).resolve() == Path(shufflefs.__file__).resolve().parent
        assert stats["gather"] == "compiled"
        out = subprocess.run([*cli, "stat", str(mnt)], cwd=decoy, env=env, capture_output=True, text=True, timeout=60)
        assert "gather            compiled" in out.stdout, out.stdout
        assert sorted((mnt / "a.jsonl").read_bytes().splitlines()) == sorted((src / "a.jsonl").read_bytes().splitlines())
        assert not marker.exists()
    finally:
        if is_mounted(mnt):
            subprocess.run([*cli, "umount", str(mnt)], env=env, capture_output=True, timeout=60)
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)


def test_a_missing_compiled_gather_is_warned_and_shown(tmp_path: Path) -> None:
    """The daemon started with the compiled module blocked (as if it was never built) serves
    through numpy, says so in its log and in ``shufflefs stat``."""
    src, mnt, log = tmp_path / "src", tmp_path / "mnt", tmp_path / "daemon.log"
    src.mkdir()
    mnt.mkdir()
    data = b"".join(b'{"i": %d}\n' % i for i in range(2000))
    (src / "a.jsonl").write_bytes(data)
    code = ("import sys; sys.modules['shufflefs._gather'] = None; sys.argv[0] = 'shufflefs'; "
            "from shufflefs.cli import main; sys.exit(main())")
    env = dict(os.environ, PYTHONPATH=str(Path(shufflefs.__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", code, "mount", "-f", str(src), str(mnt), "--cache-dir",
                             str(tmp_path / "cache"), "--log-file", str(log)], env=env, cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text() if log.exists() else ""
            time.sleep(0.05)
        assert sorted((mnt / "a.jsonl").read_bytes().splitlines()) == sorted(data.splitlines())
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        assert stats["gather"] == "numpy"
        out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(mnt)], env=env, capture_output=True,
                             text=True, timeout=60)
        assert "gather            numpy" in out.stdout and "WARNING" in out.stdout, out.stdout
        assert "compiled gather module" in log.read_text()
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=60)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)
