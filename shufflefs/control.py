"""Talking to a mount from the command line without ever hanging on it.

Every control call (the extended attributes the CLI reads and writes, a stat of the mount point)
is answered by the mount's daemon.  A daemon that is stopped (SIGSTOP), hung or gone would make
such a call wait for ever, so each runs on a thread with a deadline (`CONTROL_TIMEOUT`): a
thread stuck in a FUSE request cannot be cancelled, but it is a daemon thread and dies with the
process (a FUSE wait is killable).  Whether a path is mounted is read from ``/proc/mounts``,
which needs no answer from the daemon.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import threading
from typing import Any, Callable

CONTROL_TIMEOUT = 5.0
"""Seconds a control call waits for the daemon before it gives up with ``ETIMEDOUT``."""
UNMOUNT_TIMEOUT = 10.0
"""Seconds ``fusermount3`` may take before the unmount falls back (or fails)."""


class NoAnswer(OSError):
    """The daemon did not answer a control call in time (stopped, hung or overloaded)."""

    def __init__(self, what: str, timeout: float) -> None:
        super().__init__(errno.ETIMEDOUT, f"no answer from the mount's daemon within {timeout:g} s ({what})")


def with_deadline(fn: Callable[..., Any], *args: Any, timeout: float = CONTROL_TIMEOUT, what: str = "") -> Any:
    """``fn(*args)`` on a daemon thread; its result or exception, or `NoAnswer` after ``timeout``."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001 -- handed to the caller
            box.append((False, e))

    t = threading.Thread(target=run, name="shufflefs-control", daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise NoAnswer(what or getattr(fn, "__name__", "call"), timeout)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def get_xattr(path: str, name: str, timeout: float = CONTROL_TIMEOUT) -> bytes:
    return with_deadline(os.getxattr, path, name, timeout=timeout, what=f"getxattr {name}")


def get_xattr_apart(path: str, name: str, timeout: float = CONTROL_TIMEOUT) -> bytes:
    """`get_xattr` in a child process, killed (and reaped) if it gets no answer in time.

    For a caller that goes on to unmount: a thread of its own left waiting in the mount would
    keep it busy, while a killed process lets go of it."""
    code = "import os, sys; sys.stdout.buffer.write(os.getxattr(sys.argv[1], sys.argv[2]))"
    try:
        r = subprocess.run([sys.executable, "-I", "-c", code, path, name], capture_output=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NoAnswer(f"getxattr {name}", timeout) from None
    if r.returncode != 0:
        m = re.search(rb"\[Errno (\d+)\] ([^:\n]*)", r.stderr)
        if m:
            raise OSError(int(m.group(1)), m.group(2).decode(errors="replace"))
        raise OSError(errno.EIO, r.stderr.decode(errors="replace").strip() or "getxattr failed")
    return r.stdout


def set_xattr(path: str, name: str, value: bytes, timeout: float = CONTROL_TIMEOUT) -> None:
    with_deadline(os.setxattr, path, name, value, timeout=timeout, what=f"setxattr {name}")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_type(mountpoint: str) -> str | None:
    """The filesystem type mounted at ``mountpoint`` (absolute), from /proc/mounts; None if none.
    The last entry wins (mounts stack)."""
    found = None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                p = line.split()
                if len(p) > 2 and _unescape(p[1]) == mountpoint:
                    found = p[2]
    except OSError:
        return None
    return found


def is_shufflefs(mountpoint: str) -> bool:
    t = mount_type(mountpoint)
    return t is not None and t.startswith("fuse.shufflefs")


def unmount(mountpoint: str, lazy: bool, timeout: float = UNMOUNT_TIMEOUT) -> subprocess.CompletedProcess | None:
    """Run ``fusermount3 -u`` (``-uz`` if ``lazy``), else ``umount`` (``-l``); None if neither
    exists.  A command that does not return within ``timeout`` is killed and reported as failed."""
    flags = "-uz" if lazy else "-u"
    for cmd in (["fusermount3", flags, mountpoint], ["umount", *(["-l"] if lazy else []), mountpoint]):
        try:
            return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            continue
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} did not return within {timeout:g} s")
    return None
