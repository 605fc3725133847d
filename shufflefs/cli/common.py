"""What every command shares: the program name, exit codes, errors and small formatting helpers."""

from __future__ import annotations

import errno
import os

from ..config import (
    STATS_XATTR,
)
from ..fs import control
from ..strategies.base import OBJECT_BLOCK

PROG = "shufflefs"

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

REMOTE_BLOCK = OBJECT_BLOCK
"""``--block-size`` of an object-store source when none is given and the buffer is the default
(`strategies.base.object_block_size` of other buffers): a ranged GET costs a round trip (tens of
ms), so blocks are large enough that the transfer, not the latency, dominates, and small enough
that a buffer holds 16 of them."""


def _message(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


def _inside(path: str, parent: str) -> bool:
    return path != parent and os.path.commonpath([path, parent]) == parent


# --------------------------------------------------------------------------- xattr helpers


class CliError(Exception):
    """A failure to report as ``shufflefs CMD: error: ...``; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


def _xattr_failure(e: OSError, path: str, name: str) -> CliError:
    if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
        return CliError(f"{path}: not a shufflefs mount or a data file in one (no {name} attribute)")
    if e.errno == errno.ETIMEDOUT:
        return CliError(f"{path}: {e.strerror}; the daemon may be stopped or hung "
                        f"('{PROG} umount' still unmounts it)")
    if e.errno == errno.ENOTCONN:
        return CliError(f"{path}: the mount's daemon is gone (transport endpoint is not connected); "
                        f"run '{PROG} umount' on the mount point")
    if e.errno == errno.ENOENT:
        return CliError(f"{path}: no such file or directory")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CliError(f"{path}: {e.strerror} (changing the epoch needs write permission on it)")
    return CliError(f"{path}: {e.strerror or e}")


def get_xattr(path: str, name: str) -> bytes:
    try:
        return control.get_xattr(path, name)
    except OSError as e:
        raise _xattr_failure(e, path, name) from None


# --------------------------------------------------------------------------- epoch


def _parse_epoch(text: bytes | str, path: str) -> int:
    try:
        return int(text.decode() if isinstance(text, bytes) else text)
    except ValueError:
        raise CliError(f"{path}: unexpected epoch value {text!r}") from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _mount_root(path: str) -> str | None:
    """The root of the shufflefs mount holding ``path`` (the directory with the stats attribute)."""
    d = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            os.getxattr(d, STATS_XATTR)
            return d
        except OSError:
            pass
        if os.path.ismount(d) or d == os.path.dirname(d):
            return None
        d = os.path.dirname(d)
