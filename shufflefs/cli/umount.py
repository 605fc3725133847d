"""``shufflefs umount``: unmount, also when the daemon is stopped or hung or the source is gone."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import control
from ..config import (
    PID_XATTR,
)
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


def cmd_umount(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    mnt = os.path.abspath(args.mountpoint)
    if control.mount_type(mnt) is None:  # from /proc/mounts: no stat a hung daemon would answer
        if not os.path.lexists(mnt):
            raise CliError(f"{mnt}: no such file or directory")
        raise CliError(f"{mnt}: not mounted")
    if not control.is_shufflefs(mnt):
        raise CliError(f"{mnt}: not a shufflefs mount")
    pid: int | None = None
    try:
        pid = int(control.get_xattr_apart(mnt, PID_XATTR).decode().strip())
    except (OSError, ValueError) as e:
        # the daemon is stopped, hung, gone, or its source was removed: unmount all the same
        print(f"{PROG} umount: {mnt}: the daemon did not tell its pid ({e}); unmounting anyway", file=sys.stderr)

    result = control.unmount(mnt, args.lazy)
    if result is None:
        raise CliError("neither fusermount3 nor umount was found")
    if result.returncode != 0 and control.is_shufflefs(mnt):
        detail = (result.stderr or result.stdout).strip() or f"{result.args[0]} exit status {result.returncode}"
        hint = ""
        if "busy" in detail.lower() or result.returncode == 124:
            hint = ("\n  a process has a file open or its working directory under the mount, or the daemon "
                    f"does not answer; close it, or detach now with '{PROG} umount --lazy {args.mountpoint}'")
        raise CliError(f"cannot unmount {mnt}: {detail}{hint}")

    if pid is not None and args.lazy:
        time.sleep(0.2)
        if _alive(pid):
            print(f"{PROG} umount: {mnt} detached; its daemon (pid {pid}) exits when the last open file "
                  "under it is closed", file=sys.stderr)
    elif pid is not None:
        deadline = time.monotonic() + args.timeout
        while _alive(pid):
            if time.monotonic() >= deadline:
                raise CliError(f"{mnt} is unmounted but its daemon (pid {pid}) has not exited after {args.timeout:g} s")
            time.sleep(0.05)
    return EXIT_OK
