"""Opening paths under the source root without following symbolic links in any component.

A mounted source is a tree other people may change while it is served.  Were a directory of it
replaced by a link to ``/etc``, a path such as ``SRC/d/shadow`` opened the usual way would read
``/etc/shadow`` and serve it.  So every path under a *confined* root (`confine`, called once per
process with the source directory) is resolved from a descriptor of the root that was opened
when the mount started: with ``openat2(2)`` and ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where
the kernel has it (Linux 5.6+), else one ``O_NOFOLLOW`` step per component.  A link anywhere on
the way is ``ELOOP``; a ``..`` that leaves the root is ``EXDEV``/``ELOOP``.  Paths outside every
confined root (the cache, stage files) are opened as usual.

Symlinks shown in the mounted tree are not affected: the kernel resolves them through the mount,
and the daemon only reads them with `readlink_beneath`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import threading

O_PATH = getattr(os, "O_PATH", 0o10000000)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (and every architecture since 5.6)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_have_openat2: bool | None = None
_roots: dict[str, tuple[int, int]] = {}  # root path -> (descriptor, pid that opened it)
_users: dict[str, int] = {}  # root path -> confine() calls not yet released
_lock = threading.Lock()


def confine(root: str | os.PathLike) -> None:
    """From now on, paths under ``root`` (absolute, as the callers spell it) resolve beneath it,
    until as many `release` calls as `confine` calls."""
    path = os.path.abspath(os.fspath(root))
    with _lock:
        _users[path] = _users.get(path, 0) + 1
        _open_root(path)


def _open_root(path: str) -> None:
    known = _roots.get(path)
    if known is not None and known[1] == os.getpid():
        return
    _roots[path] = (os.open(path, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), os.getpid())


def release(root: str | os.PathLike) -> None:
    """One user of ``root``'s confinement is done (a catalog shut down); the last one ends it."""
    path = os.path.abspath(os.fspath(root))
    with _lock:
        left = _users.get(path, 0) - 1
        if left > 0:
            _users[path] = left
            return
        _users.pop(path, None)
        known = _roots.pop(path, None)
    if known is not None and known[1] == os.getpid():
        os.close(known[0])


def roots() -> list[str]:
    """The confined roots (to confine a worker process the same way)."""
    return list(_roots)


def _split(path: str) -> tuple[int, str] | None:
    """``(root descriptor, path relative to it)`` if ``path`` lies under a confined root."""
    path = os.path.abspath(os.fsdecode(path))
    for root, (fd, pid) in list(_roots.items()):
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            if pid != os.getpid():  # inherited through fork: open our own
                with _lock:
                    _open_root(root)
                fd = _roots[root][0]
            return fd, os.path.relpath(path, root)
    return None


def _openat2(dirfd: int, rel: str, flags: int) -> int:
    global _have_openat2
    how = _OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        _have_openat2 = True
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _have_openat2 is None:  # no openat2, or a seccomp filter
        _have_openat2 = False
        return _walk(dirfd, rel, flags)
    if err == errno.EAGAIN:  # a rename raced the lookup: try once more the careful way
        return _walk(dirfd, rel, flags)
    raise OSError(err, os.strerror(err), rel)


def _walk(dirfd: int, rel: str, flags: int) -> int:
    """One component at a time, never following a link; ``..`` is refused."""
    parts = [p for p in rel.split(os.sep) if p not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EXDEV, "path leaves the source", rel)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dirfd)
    fd = os.open(".", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        for p in parts[:-1]:
            try:
                nxt = os.open(p, O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except NotADirectoryError:
                if stat.S_ISLNK(os.stat(p, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from None
                raise
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def _open_any(path: str, flags: int) -> int:
    where = _split(path)
    if where is None:
        return os.open(path, flags | os.O_CLOEXEC)
    dirfd, rel = where
    if _have_openat2 is False:
        return _walk(dirfd, rel, flags)
    return _openat2(dirfd, rel, flags)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


def special_file_error(path: str, mode: int) -> OSError:
    """A name that should hold a regular file holds a FIFO, socket or device (``ENXIO``): it is
    never opened for reading, since opening a FIFO blocks until a writer comes and opening a
    device may act on it.  (A plain OSError: it crosses from indexing processes by pickle.)"""
    return OSError(errno.ENXIO, f"{_kind(mode)}, not a regular file: never opened", path)


def reopen(pinned: int, flags: int = os.O_RDONLY) -> int:
    """The file held by the ``O_PATH`` descriptor ``pinned``, opened for reading through
    ``/proc/self/fd``: the same inode whatever its name names now, opened with ``O_NONBLOCK``
    (the caller checked its type on ``pinned``).  ``FileNotFoundError`` without ``/proc``."""
    return os.open(f"/proc/self/fd/{pinned}", flags | os.O_NONBLOCK | os.O_CLOEXEC)


def open_path(path: str | os.PathLike, flags: int = os.O_RDONLY) -> int:
    """``os.open(path, flags)``, resolved beneath its confined root if it has one.

    Anything but an ``O_PATH`` open is only ever made of a regular file (or of a directory, with
    ``O_DIRECTORY``): the name is first opened with ``O_PATH``, which opens nothing (no FIFO
    waits for a writer, no device driver runs), its type is checked on that descriptor, and the
    same inode is then reopened for reading through ``/proc/self/fd`` with ``O_NONBLOCK``, so a
    name swapped for a FIFO between a stat and the open can never block the caller.
    `special_file_error` (``ENXIO``) otherwise."""
    path = os.fspath(path)
    if flags & O_PATH:
        return _open_any(path, flags)
    pinned = _open_any(path, O_PATH | (flags & os.O_DIRECTORY))
    try:
        mode = os.fstat(pinned).st_mode
        if stat.S_ISLNK(mode):  # O_PATH | O_NOFOLLOW (the careful walk) opens a link itself
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if not (stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and flags & os.O_DIRECTORY)):
            raise special_file_error(path, mode)
        try:
            fd = reopen(pinned, flags)  # the same inode, already checked
        except FileNotFoundError:  # no /proc: open the name again, without blocking, and check it
            fd = _open_any(path, flags | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if not (stat.S_ISREG(st.st_mode) or (stat.S_ISDIR(st.st_mode) and flags & os.O_DIRECTORY)):
                    raise special_file_error(path, st.st_mode)
            except BaseException:
                os.close(fd)
                raise
    finally:
        os.close(pinned)
    os.set_blocking(fd, not flags & os.O_NONBLOCK)  # O_NONBLOCK was for the open only
    return fd


def stat_path(path: str | os.PathLike, follow_last: bool = True) -> os.stat_result:
    """``os.stat`` (``os.lstat`` if not ``follow_last``) without following links on the way.
    A link as the last component is ELOOP when ``follow_last`` (it would be followed)."""
    path = os.fspath(path)
    if _split(path) is None:
        return os.stat(path) if follow_last else os.lstat(path)
    if follow_last:
        fd = open_path(path, O_PATH)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)
    parent, name = os.path.split(os.path.abspath(path))
    if _split(parent) is None:  # the root itself
        return os.lstat(path)
    fd = open_path(parent, O_PATH | os.O_DIRECTORY)
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def list_dir(path: str | os.PathLike) -> list[str]:
    """The names in a directory reached without following links."""
    fd = open_path(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as it:
            return [e.name for e in it]
    finally:
        os.close(fd)


def readlink_beneath(path: str | os.PathLike) -> str:
    """The target of the link ``path``, whose directory is reached without following links."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    fd = open_path(parent, O_PATH | os.O_DIRECTORY)
    try:
        return os.readlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def unescape_mount_field(field: str) -> str:
    """A path field of /proc/mounts or mountinfo as it was (``\\040`` is a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_device(mountpoint: str) -> int | None:
    """The device number (``st_dev``) of the mount at ``mountpoint``, read from
    ``/proc/self/mountinfo`` without a stat of it (which this daemon would have to answer)."""
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                p = line.split()
                if len(p) > 4 and unescape_mount_field(p[4]) == mountpoint:
                    major, minor = p[2].split(":")
                    found = os.makedev(int(major), int(minor))
    except (OSError, ValueError, IndexError):
        return None
    return found
