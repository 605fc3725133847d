"""``shufflefs epoch``: read or set the epoch of a mount, a directory or a file."""

from __future__ import annotations

import argparse
import errno

from ..config import (
    EPOCH_XATTR,
    MAX_EPOCH,
)
from ..mount import control
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
