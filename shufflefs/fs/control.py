"""Talking to a mount from the command line without ever hanging on it.

Every control call (the extended attributes the CLI reads and writes, a stat of the mount point)
is answered by the mount's daemon.  A daemon that is stopped (SIGSTOP), hung or gone would make
such a call wait for ever, so each runs on a thread with a deadline (`CONTROL_TIMEOUT`): a
thread stuck in a FUSE request cannot be cancelled, but it is a daemon thread and dies with the
process (a FUSE wait is killable).  Whether a path is mounted is read from ``/proc/mounts``,
which needs no answer from the daemon.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import subprocess
import threading
from typing import Any, Callable

from ..resolve import mount_device, unescape_mount_field

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


def set_xattr(path: str, name: str, value: bytes, timeout: float = CONTROL_TIMEOUT) -> None:
    with_deadline(os.setxattr, path, name, value, timeout=timeout, what=f"setxattr {name}")


def mount_type(mountpoint: str) -> str | None:
    """The filesystem type mounted at ``mountpoint`` (absolute), from /proc/mounts; None if none.
    The last entry wins (mounts stack)."""
    found = None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                p = line.split()
                if len(p) > 2 and unescape_mount_field(p[1]) == mountpoint:
                    found = p[2]
    except OSError:
        return None
    return found


def is_shufflefs(mountpoint: str) -> bool:
    t = mount_type(mountpoint)
    return t is not None and t.startswith("fuse.shufflefs")


def mount_path(path: str) -> str | None:
    """The mount point ``path`` names if it is the root of a shufflefs mount, however it is
    spelled (relative, with ``..``, through a linked parent directory), else None.  Only the
    parent is resolved, within `CONTROL_TIMEOUT`: nothing asks the mount itself."""
    spelled = os.path.abspath(path)
    if is_shufflefs(spelled):
        return spelled
    parent, name = os.path.split(spelled)
    if not name:
        return None
    try:
        real = os.path.join(with_deadline(os.path.realpath, parent, what="realpath"), name)
    except OSError:
        return None
    return real if is_shufflefs(real) else None


def mount_owner(mountpoint: str) -> int | None:
    """The uid that mounted the FUSE mount at ``mountpoint`` (its ``user_id`` option in
    /proc/self/mountinfo), or None."""
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                head, _, tail = line.partition(" - ")
                p, q = head.split(), tail.split()
                if len(p) > 4 and len(q) > 2 and unescape_mount_field(p[4]) == mountpoint:
                    found = next((int(o[8:]) for o in q[2].split(",") if o.startswith("user_id=")), None)
    except (OSError, ValueError):
        return None
    return found


# --------------------------------------------------------------------------- outside the mount
#
# A daemon whose requests hang (a hung source, SIGSTOP) makes every call through its mount wait,
# the getxattr that asked for its pid included.  So the daemon also leaves a pid file in a run
# directory, and the kernel's FUSE control files (fusectl) can end its connection: nothing below
# ever touches a path inside the mount.

FUSECTL = "/sys/fs/fuse/connections"


def run_dir() -> str:
    """Where daemons leave their pid files: ``/run/shufflefs`` for root, else
    ``$XDG_RUNTIME_DIR/shufflefs`` (or a private directory in the temporary directory)."""
    if os.geteuid() == 0:
        return "/run/shufflefs"
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return os.path.join(base, "shufflefs")
    return os.path.join("/tmp", f"shufflefs-{os.geteuid()}")


def pid_file(mountpoint: str) -> str:
    """The pid file of the daemon serving ``mountpoint`` (absolute): one per mount point."""
    key = hashlib.sha256(os.fsencode(mountpoint)).hexdigest()[:24]
    return os.path.join(run_dir(), f"{key}.pid")


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_pid_file(mountpoint: str, source: str) -> str | None:
    """Record this process as the daemon of ``mountpoint``; the path written, or None (logged by
    the caller) if the run directory cannot be written.  Pid files of daemons that are gone
    (killed, or ended by the watchdog) are removed first."""
    path = pid_file(mountpoint)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    sweep_pid_files()
    body = json.dumps({"pid": os.getpid(), "start": _start_time(os.getpid()), "mountpoint": mountpoint,
                       "source": source})
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(body)
    os.replace(tmp, path)
    return path


def remove_pid_file(path: str | None) -> None:
    """Remove ``path`` if it still names this process (a later daemon of the same mount point
    may have replaced it)."""
    if path is None:
        return
    try:
        with open(path) as f:
            if json.load(f).get("pid") != os.getpid():
                return
        os.unlink(path)
    except (OSError, ValueError):
        pass


def _alive(info: dict) -> bool:
    """Whether the process a pid file describes still runs (a reused pid has another start time,
    a zombie never runs again)."""
    try:
        with open(f"/proc/{int(info['pid'])}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        state, start = fields[0], int(fields[19])
    except (OSError, KeyError, TypeError, ValueError, IndexError):
        return False
    return state != b"Z" and (info.get("start") is None or start == info["start"])


def sweep_pid_files() -> int:
    """Remove the pid files (and half-written ones) of daemons that no longer run; how many."""
    removed = 0
    try:
        names = os.listdir(run_dir())
    except OSError:
        return 0
    for name in names:
        path = os.path.join(run_dir(), name)
        if name.endswith(".tmp"):  # KEY.pid.PID.tmp, of a daemon that died while writing it
            try:
                gone = _start_time(int(name.rsplit(".", 2)[-2])) is None
            except ValueError:
                continue
        elif name.endswith(".pid"):
            try:
                with open(path) as f:
                    gone = not _alive(json.load(f))
            except (OSError, ValueError, AttributeError):
                continue
        else:
            continue
        if gone:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    return removed


def daemon_pid(mountpoint: str) -> int | None:
    """The pid of the live daemon serving ``mountpoint`` according to its pid file, or None
    (no file, or its process is gone: a pid reused since is told apart by its start time)."""
    try:
        with open(pid_file(mountpoint)) as f:
            info = json.load(f)
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if info.get("mountpoint") != mountpoint or not _alive(info):
        return None
    return pid


def connection(mountpoint: str) -> int | None:
    """The FUSE connection number of the mount at ``mountpoint`` (its device's minor number,
    from /proc/self/mountinfo: no stat of the mount point).  The last mount there wins."""
    dev = mount_device(mountpoint)
    return None if dev is None else os.minor(dev)


def _fusectl() -> str | None:
    """The FUSE control directory, mounted if it is not (root only); None if unavailable."""
    if os.path.isdir(os.path.join(FUSECTL, ".")) and os.listdir(FUSECTL):
        return FUSECTL
    try:
        subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL], capture_output=True, timeout=5,
                       stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return FUSECTL if os.path.isdir(FUSECTL) else None


def waiting(mountpoint: str) -> int | None:
    """Requests the mount's daemon has not answered yet (fusectl's ``waiting``), or None."""
    conn, ctl = connection(mountpoint), _fusectl()
    if conn is None or ctl is None:
        return None
    try:
        with open(os.path.join(ctl, str(conn), "waiting")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def abort(mountpoint: str) -> bool:
    """End the mount's FUSE connection: every request waiting on the daemon fails at once
    (``ENOTCONN``), so readers stuck in it return and the mount can be detached."""
    conn, ctl = connection(mountpoint), _fusectl()
    if conn is None or ctl is None:
        return False
    try:
        with open(os.path.join(ctl, str(conn), "abort"), "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def detach(mountpoint: str) -> bool:
    """Lazily unmount ``mountpoint`` (``umount2(MNT_DETACH)`` as root; else ``fusermount3 -uz``)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(mountpoint), 2) == 0:  # MNT_DETACH
            return True
    r = unmount(mountpoint, lazy=True, timeout=CONTROL_TIMEOUT)
    return r is not None and r.returncode == 0


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
