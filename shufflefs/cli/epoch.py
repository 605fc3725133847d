"""``shufflefs epoch``: read or set the epoch of a mount, a directory or a file."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import tempfile
from typing import Iterator

from ..config import (
    EPOCH_XATTR,
    MAX_EPOCH,
    RESUME_FILE_MAX,
    RESUME_INLINE,
    RESUME_XATTR,
)
from ..fs import control
from ..strategies.resume import ResumeError, ResumeState
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    _parse_epoch,
    _xattr_failure,
    get_xattr,
)


EPOCH_ARG = re.compile(r"0|[1-9][0-9]{0,9}")
"""An epoch as ``shufflefs epoch`` takes it: as the attribute reads back (no sign, spaces or
leading zeros), so that the command and ``setfattr`` refuse the same values."""
RESUME_TIMEOUT = 60.0
"""Seconds the mount may take to read and check a resume state (up to `RESUME_FILE_MAX` bytes)."""


def _epoch_arg(text: str, parser: argparse.ArgumentParser, alternatives: str = "") -> int:
    if EPOCH_ARG.fullmatch(text) is None or int(text) > MAX_EPOCH:
        parser.error(f"epoch {text!r}: not an epoch: a decimal from 0 to {MAX_EPOCH} without sign, spaces "
                     f"or leading zeros{alternatives}")
    return int(text)


def cmd_epoch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    path = args.path
    if args.resume is not None:
        return _resume(args, parser)
    new = None if args.value in (None, "next") else _epoch_arg(args.value, parser, " (or 'next')")
    current = _parse_epoch(get_xattr(path, EPOCH_XATTR).strip(), path)
    if args.value is None:
        print(current)
        return EXIT_OK
    if args.value == "next":
        new = current + 1
    try:
        control.set_xattr(path, EPOCH_XATTR, str(new).encode())
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CliError(f"{path}: invalid epoch {new} (rejected by the filesystem)", EXIT_USAGE) from None
        raise _refused(e, path, EPOCH_XATTR) from None
    if args.value == "next":
        print(new)
    return EXIT_OK


def _refused(e: OSError, path: str, name: str) -> CliError:
    """The mount's ``EPERM`` for a user other than its owner and root: says who may."""
    if e.errno == errno.EPERM and os.geteuid() != 0:
        owner = control.mount_owner(control.mount_path(path) or "")
        if owner is not None and owner != os.geteuid():
            return CliError(f"{path}: only the mount's owner (uid {owner}) and root may set its epochs and resume "
                            f"states (it was mounted without --epoch-setters any)")
    return _xattr_failure(e, path, name)


def _resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Check the state here (a mistake is a usage error in the user's terminal, not an EINVAL),
    then hand the mount its bytes: inline, or when too large for an attribute, a private copy
    outside every mount (`_private_copy`), so the daemon never reads a file through a mount."""
    path, source = args.path, args.resume
    if args.value is None or args.value == "next":
        parser.error("--resume needs the epoch to resume: shufflefs epoch MNT N --resume STATE")
    epoch = _epoch_arg(args.value, parser)
    if control.mount_path(path) is None:
        raise CliError(f"{path}: --resume applies to a mount's root (every view), and this is none", EXIT_USAGE)
    try:
        with open(source, "rb") as f:
            text = f.read(RESUME_FILE_MAX + 1)
    except OSError as e:
        raise CliError(f"{source}: cannot read the resume state: {e.strerror}", EXIT_USAGE) from None
    resume(path, text, epoch, source)
    return EXIT_OK


def resume(path: str, text: bytes, epoch: int | None, source: str) -> int:
    """Resume the state ``text`` (JSON, named ``source`` in errors) on the mount root ``path``;
    ``epoch``, if given, must be the state's.  Returns the state's epoch; raises `CliError`."""
    if len(text) > RESUME_FILE_MAX:
        raise CliError(f"{source}: a resume state is at most {RESUME_FILE_MAX} bytes", EXIT_USAGE)
    try:
        state = ResumeState.from_json(text, MAX_EPOCH)
    except ResumeError as e:
        raise CliError(f"{source}: {_printable(str(e))}", EXIT_USAGE) from None
    if epoch is not None and state.epoch != epoch:
        raise CliError(f"{source} is a state of epoch {state.epoch}, not {epoch}", EXIT_USAGE)
    missing = _missing(path, state)
    if missing:
        shown = ", ".join(_printable(repr(p)) for p in missing[:5]) + (f" and {len(missing) - 5} more"
                                                                        if len(missing) > 5 else "")
        raise CliError(f"{source} names {shown}, not a file of {path}: a state of another dataset or mount?",
                       EXIT_USAGE)
    compact = state.to_json().encode()
    if len(compact) < len(text):
        text = compact
    try:
        if len(text) <= RESUME_INLINE:
            control.set_xattr(path, RESUME_XATTR, text, timeout=RESUME_TIMEOUT)
        else:
            with _private_copy(text) as copy:
                control.set_xattr(path, RESUME_XATTR, b"@" + os.fsencode(copy), timeout=RESUME_TIMEOUT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CliError(f"{path}: the mount refused the resume state (its log says why)", EXIT_USAGE) from None
        if e.errno == errno.EACCES and len(text) > RESUME_INLINE:
            raise CliError(f"{path}: a state over {RESUME_INLINE} bytes is handed to the mount as a file, which "
                           "only the mount's owner and root may do", EXIT_USAGE) from None
        raise _refused(e, path, RESUME_XATTR) from None
    return state.epoch


def _missing(mnt: str, state: ResumeState) -> list[str]:
    """The views ``state`` names that are not in the mount (as far as this user can see)."""
    missing = []
    for relpath in state.views:
        try:
            control.with_deadline(os.stat, os.path.join(mnt, relpath), what=f"stat {relpath!r}")
        except FileNotFoundError:
            missing.append(relpath)
        except control.NoAnswer as e:
            raise _xattr_failure(e, mnt, RESUME_XATTR) from None
        except (OSError, ValueError):  # no right to look, or a name no path can hold: the mount decides
            continue
    return missing


@contextlib.contextmanager
def _private_copy(text: bytes) -> Iterator[str]:
    """``text`` in a file only this user can read, in the run directory (outside every mount),
    removed once the mount has read it (its ``setxattr`` returns after reading)."""
    where = control.run_dir()
    os.makedirs(where, mode=0o700, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="resume-", suffix=".json", dir=where)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        yield name
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass


def _printable(text: str) -> str:
    """``text`` that any terminal encoding can print (a state may name a path that is no UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
