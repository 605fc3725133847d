"""``shufflefs advise``: measure the storage and recommend a block size and buffer."""

from __future__ import annotations

import argparse
import os

from .common import EXIT_OK, CliError
from .options import _size


def cmd_advise(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..advise import AdviseError, format_report, probe, recommend

    if not os.path.isdir(args.source):
        parser.error(f"source {args.source!r} is not a directory")
    try:
        budget = _size(args.budget)
    except ValueError as e:
        parser.error(f"argument --budget: {e}")
    try:
        seconds = float(args.seconds)
    except ValueError:
        parser.error(f"argument --seconds: not a number: {args.seconds!r}")
    if not 0 < seconds <= 3600:
        parser.error(f"argument --seconds: must be in (0, 3600]: {args.seconds!r}")
    try:
        result = probe(args.source, seconds=seconds)
        advice = recommend(result, budget)
    except AdviseError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{e.filename or args.source}: {e.strerror or e}") from None
    print(format_report(result, advice))
    return EXIT_OK
