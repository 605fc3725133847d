"""Who may do what on a mount other users can reach (``--allow-other``), and reading a resume
state from a file without ever reading this mount.

The mount's owner is the user its daemon runs as.  The kernel checks every request against the
source's modes (the mount always has ``default_permissions``): reading a view, pass-through file
or any attribute of it (``user.shufflefs.error`` included) needs read permission on it, setting an
attribute write permission.  On top of that the daemon decides by the caller's uid:

- setting ``user.shufflefs.epoch`` or ``user.shufflefs.resume``, and reading the resume state:
  the owner and root, or anyone with ``--epoch-setters any``;
- a resume state given as ``@PATH``: the owner and root only, since the daemon opens ``PATH``
  with its own rights, which may exceed the caller's;
- ``user.shufflefs.stats`` (``shufflefs stat``) names files (errors, resumed views, files with
  few blocks, own epochs): others see the counters without those names.

A state file is opened on a worker thread with a deadline, never on the event loop: a path in
this mount (or a link or bind mount leading there) would wait for the daemon's own answer, and
its ``setxattr`` holds the root's lock that a lookup under the root needs.  Such a path is
refused by name, then by device."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Any

from ..resolve import mount_device

ROOT_UID = 0
SETTERS = ("owner", "any")
"""``--epoch-setters``: who may set epochs and resume states besides root."""
O_PATH = getattr(os, "O_PATH", 0o10000000)


@dataclass(frozen=True)
class Caller:
    """The process behind a request (the kernel's ``uid``, ``gid`` and ``pid`` of it)."""

    uid: int
    gid: int = -1
    pid: int = 0

    @classmethod
    def of(cls, ctx: Any) -> "Caller":
        return cls(int(ctx.uid), int(ctx.gid), int(ctx.pid))


OWNER = Caller(os.geteuid())
"""Requests made without a caller (tests driving a catalog) act as the owner."""


def trusted(caller: Caller) -> bool:
    """The mount's owner or root: may read anything the daemon reads."""
    return caller.uid in (os.geteuid(), ROOT_UID)


def may_set(caller: Caller, setters: str) -> bool:
    """Whether ``caller`` may set epochs and resume states under ``--epoch-setters``."""
    return setters == "any" or trusted(caller)


def who_may_set(setters: str) -> str:
    return "anyone" if setters == "any" else f"the mount's owner (uid {os.geteuid()}) and root"




def _inside(path: str, mountpoint: str) -> bool:
    return path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")


def read_state_file(where: str, mountpoint: str, limit: int) -> bytes:
    """Blocking: the bytes of the resume state file ``where`` (absolute), at most ``limit``.
    ValueError says why it is refused: not absolute, in this mount (by name, or by device once
    reached), a link, not a regular file, too large.  Opened ``O_PATH`` first (nothing is opened
    on the way, no FIFO waits) and reopened for reading only once checked."""
    if not os.path.isabs(where):
        raise ValueError("the path must be absolute")
    mnt = os.path.normpath(mountpoint)
    if _inside(os.path.normpath(where), mnt):
        raise ValueError(f"it is inside this mount ({mnt}), which its daemon never reads: "
                         "give the state itself (shufflefs epoch sends its bytes) or a file outside the mount")
    pinned = os.open(where, O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(pinned)
        if st.st_dev == mount_device(mnt):
            raise ValueError(f"it leads into this mount ({mnt}), which its daemon never reads")
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "a symbolic link: not followed")
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise ValueError(f"not a regular file of at most {limit} bytes")
        fd = os.open(f"/proc/self/fd/{pinned}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(pinned)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data
