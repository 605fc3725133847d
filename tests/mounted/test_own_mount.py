"""Level: mounted (a real daemon traced with strace).

A daemon never waits on its own mount from one of its own threads: a thread waiting for the
answer to its own request when the daemon is killed (SIGKILL) waits uninterruptibly, so the
killed process never ends and its FUSE connection lives until someone aborts it.  The one stat
of the mount point a daemon needs (to set the mount's readahead once the kernel has agreed the
handshake's) is made by a child process, which just gets ENOTCONN when its daemon dies."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, is_mounted, wait_for

STATS = "stat,lstat,newfstatat,statx,access,faccessat,faccessat2,openat,open,getxattr,lgetxattr,statfs"


def strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-f", "-o", "/dev/null", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not strace_works(), reason="needs strace (ptrace allowed)")
def test_the_daemon_touches_its_own_mount_only_through_a_child_process(tmp_path):
    """Holds: SEMANTICS.md#umount-killed"""
    src, mnt, log = tmp_path / "src", tmp_path / "mnt", tmp_path / "trace"
    src.mkdir()
    mnt.mkdir()
    (src / "a.jsonl").write_bytes(b"".join(b'{"i": %d}\n' % i for i in range(100)))
    cmd = ["strace", "-f", "-qq", "-e", f"trace={STATS},execve,mount", "-o", str(log),
           sys.executable, "-m", "shufflefs", "mount", "-f", str(src), str(mnt), "--cache-dir", str(tmp_path / "c")]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: is_mounted(mnt), "the mount")
        wait_for(lambda: f'"{mnt}"' in log.read_text(errors="replace"), "the readahead's stat of the mount point")
        assert sorted(p.name for p in mnt.iterdir()) == ["a.jsonl"]
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=30)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)
    lines = log.read_text(errors="replace").splitlines()
    mounted_at = next(i for i, line in enumerate(lines) if re.search(r"\bmount\(.*= 0$", line))
    daemon = lines[0].split()[0]
    children = {line.split()[0] for line in lines if "execve(" in line and line.split()[0] != daemon}
    stat_children = {line.split()[0] for line in lines if re.search(r'execve\("[^"]*/stat"', line)}
    inside = re.compile(re.escape(f'"{mnt}') + r'(/[^"]*)?"')
    own = [line for line in lines[mounted_at + 1:] if inside.search(line) and line.split()[0] not in children]
    assert stat_children, "the mount point's stat is made by a child process"
    assert not own, f"the daemon itself touched its mount: {own[:3]}"
