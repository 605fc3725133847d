"""``shufflefs umount``: unmount, also when the daemon is stopped or hung or the source is gone."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..fs import control
from .common import EXIT_OK, PROG, CliError


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as exited: it no longer holds the mount)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


HUNG_AFTER = control.CONTROL_TIMEOUT
"""Seconds a busy mount's daemon may leave requests unanswered before `shufflefs umount` treats
it as hung: then it ends the FUSE connection, detaches the mount and ends the daemon."""


def _writes(pid: int | None) -> int | None:
    """Write calls the process has made (``syscw``): every FUSE reply is one."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("syscw:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _hung(mnt: str, within: float, pid: int | None) -> bool:
    """Whether the daemon leaves requests unanswered for ``within`` seconds: requests wait at
    every sample (a request answered meanwhile shows as the count dropping to zero at some
    sample), and the daemon writes nothing (every reply is a write: a busy daemon whose readers
    keep a request in flight at all times is answering, not hung)."""
    end = time.monotonic() + within
    before = _writes(pid)
    while True:
        n = control.waiting(mnt)
        if not n:
            return False
        if time.monotonic() >= end:
            after = _writes(pid)
            return before is None or after is None or after == before
        time.sleep(0.1)


def _end(pid: int, grace: float) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; whether the process is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        end = time.monotonic() + wait
        while _alive(pid):
            if time.monotonic() >= end:
                break
            time.sleep(0.05)
        else:
            return True
    return not _alive(pid)


def _force(mnt: str, pid: int | None) -> None:
    """The daemon does not answer: end its connection (stuck callers return ENOTCONN), detach
    the mount, end the daemon."""
    print(f"{PROG} umount: {mnt}: the daemon{f' (pid {pid})' if pid else ''} leaves requests unanswered; "
          "ending its connection and detaching the mount", file=sys.stderr)
    control.abort(mnt)
    if control.is_shufflefs(mnt) and not control.detach(mnt) and control.is_shufflefs(mnt):
        raise CliError(f"cannot detach {mnt}")
    if pid is not None and not _end(pid, 1.0):
        raise CliError(f"{mnt} is detached but its daemon (pid {pid}) does not exit (stuck in the kernel?)")
    control.sweep_pid_files()  # a daemon ended by SIGKILL leaves its pid file


def cmd_umount(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    unmount(os.path.abspath(args.mountpoint), args.lazy, args.timeout, shown=args.mountpoint)
    return EXIT_OK


def unmount(mnt: str, lazy: bool = False, timeout: float = 10.0, shown: str | None = None) -> None:
    """Unmount ``mnt`` (absolute) and wait up to ``timeout`` seconds for its daemon to exit
    (`shufflefs umount` and `shufflefs.Mount.unmount`); raises `CliError` saying why not.
    Nothing here passes through the mount: the daemon is found by its pid file, a hung one by
    the kernel's count of its unanswered requests (fusectl)."""
    if control.mount_type(mnt) is None:  # from /proc/mounts: no stat a hung daemon would answer
        if not os.path.lexists(mnt):
            raise CliError(f"{mnt}: no such file or directory")
        raise CliError(f"{mnt}: not mounted")
    if not control.is_shufflefs(mnt):
        raise CliError(f"{mnt}: not a shufflefs mount")
    pid = control.daemon_pid(mnt)
    if pid is None:
        print(f"{PROG} umount: {mnt}: no live daemon is recorded for it (in {control.run_dir()}); "
              "unmounting anyway", file=sys.stderr)

    result = control.unmount(mnt, lazy, timeout=control.CONTROL_TIMEOUT)
    if result is None:
        raise CliError("neither fusermount3 nor umount was found")
    if result.returncode != 0 and control.is_shufflefs(mnt):
        detail = (result.stderr or result.stdout).strip() or f"{result.args[0]} exit status {result.returncode}"
        if result.returncode == 124 or _hung(mnt, HUNG_AFTER, pid):
            _force(mnt, pid)
            return
        hint = ""
        if "busy" in detail.lower():
            hint = ("\n  a process has a file open or its working directory under the mount; close it, "
                    f"or detach now with '{PROG} umount --lazy {shown or mnt}'")
        raise CliError(f"cannot unmount {mnt}: {detail}{hint}")

    if pid is None:  # a killed daemon left its pid file
        control.sweep_pid_files()
    elif lazy:
        time.sleep(0.2)
        if _alive(pid):
            print(f"{PROG} umount: {mnt} detached; its daemon (pid {pid}) exits when the last open file "
                  "under it is closed", file=sys.stderr)
    else:
        deadline = time.monotonic() + timeout
        while _alive(pid):
            if time.monotonic() >= deadline:
                if not _end(pid, 1.0):
                    raise CliError(f"{mnt} is unmounted but its daemon (pid {pid}) did not exit after "
                                   f"{timeout:g} s, nor when it was killed")
                print(f"{PROG} umount: {mnt} is unmounted; its daemon (pid {pid}) did not exit within "
                      f"{timeout:g} s and was ended", file=sys.stderr)
                break
            time.sleep(0.05)
