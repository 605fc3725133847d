"""``shufflefs epoch``: read or set the epoch of a mount, a directory or a file."""

from __future__ import annotations

import argparse
import errno
import os

from ..config import (
    EPOCH_XATTR,
    MAX_EPOCH,
    RESUME_FILE_MAX,
    RESUME_INLINE,
    RESUME_XATTR,
)
from ..mount import control
from ..strategies.resume import ResumeError, ResumeState
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    _parse_epoch,
    _xattr_failure,
    get_xattr,
)
from .options import _integer


def cmd_epoch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    path = args.path
    if args.resume is not None:
        return _resume(args, parser)
    current = _parse_epoch(get_xattr(path, EPOCH_XATTR).strip(), path)
    if args.value is None:
        print(current)
        return EXIT_OK
    if args.value == "next":
        new = current + 1
    else:
        try:
            new = _integer(0, MAX_EPOCH)(args.value.strip())
        except ValueError as e:
            parser.error(f"epoch {args.value!r}: {e} (or 'next')")
    try:
        control.set_xattr(path, EPOCH_XATTR, str(new).encode())
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CliError(f"{path}: invalid epoch {new} (rejected by the filesystem)", EXIT_USAGE) from None
        raise _xattr_failure(e, path, EPOCH_XATTR) from None
    if args.value == "next":
        print(new)
    return EXIT_OK


def _resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Check the state here (a mistake is a usage error in the user's terminal, not an EINVAL),
    then hand it to the mount: its JSON, or its path when it is too large for an attribute."""
    path, source = args.path, args.resume
    if args.value is None or args.value == "next":
        parser.error("--resume needs the epoch to resume: shufflefs epoch MNT N --resume STATE")
    try:
        epoch = _integer(0, MAX_EPOCH)(args.value.strip())
    except ValueError as e:
        parser.error(f"epoch {args.value!r}: {e}")
    if not control.is_shufflefs(path):
        raise CliError(f"{path}: --resume applies to a mount's root (every view), and this is none", EXIT_USAGE)
    try:
        with open(source, "rb") as f:
            text = f.read(RESUME_FILE_MAX + 1)
    except OSError as e:
        raise CliError(f"{source}: cannot read the resume state: {e.strerror}", EXIT_USAGE) from None
    if len(text) > RESUME_FILE_MAX:
        raise CliError(f"{source}: a resume state is at most {RESUME_FILE_MAX} bytes", EXIT_USAGE)
    try:
        state = ResumeState.from_json(text, MAX_EPOCH)
    except ResumeError as e:
        raise CliError(f"{source}: {e}", EXIT_USAGE) from None
    if state.epoch != epoch:
        raise CliError(f"{source} is a state of epoch {state.epoch}, not {epoch}", EXIT_USAGE)
    value = text if len(text) <= RESUME_INLINE else b"@" + os.fsencode(os.path.abspath(source))
    try:
        control.set_xattr(path, RESUME_XATTR, value)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CliError(f"{path}: the mount refused the resume state (its log says why)", EXIT_USAGE) from None
        raise _xattr_failure(e, path, RESUME_XATTR) from None
    return EXIT_OK
