"""``shufflefs advise``: measure the storage, recommend a block size and buffer, and cache the
measurement for the source's device (`shufflefs.advise.cache`, read by mounts)."""

from __future__ import annotations

import argparse
import os

from .common import EXIT_OK, CliError
from .options import _size


def cmd_advise(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..advise import AdviseError, format_report, probe, recommend
    from ..advise.cache import record, save
    from ..advise.target import for_mix, format_mix

    objects = _object_rows(args, parser)
    if "://" in args.source:
        print(objects)
        return EXIT_OK
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
        target_mix = float(getattr(args, "target_mix", None) or 0.074)
    except ValueError:
        parser.error(f"argument --target-mix: not a number: {args.target_mix!r}")
    if not 0.038 < target_mix < 1:
        parser.error(f"argument --target-mix: must be above a uniform shuffle's 0.038 and below 1: {target_mix}")
    try:
        result = probe(args.source, seconds=seconds)
        advice = recommend(result, budget)
    except AdviseError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{e.filename or args.source}: {e.strerror or e}") from None
    print(format_report(result, advice))
    print()
    print(format_mix(for_mix(target_mix, advice.block_size), advice))
    if args.buffer:
        print()
        print(objects)
    if not getattr(args, "no_save", False):
        try:
            path = save(args.source, record(result))
        except OSError as e:
            raise CliError(f"cannot save the measurement: {e.filename or ''}: {e.strerror or e}") from None
        print(f"\nsaved for this device (mounts read the block-size floor from it): {path}")
    return EXIT_OK


BUFFERS = (16 << 20, 32 << 20, 64 << 20, 128 << 20, 256 << 20, 1 << 30)
"""The buffers stated for a bucket when no --buffer is given (64 MiB is the default)."""


def _object_rows(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """What each buffer (``--buffer``, else `BUFFERS`) gives on object storage."""
    from ..advise.objects import CONN_RATE, advise_objects, format_objects
    from ..config import MIN_BUFFER, MAX_SIZE

    try:
        buffers = [_size(b) for b in args.buffer] if args.buffer else list(BUFFERS)
        link = _size(args.link_rate)
    except ValueError as e:
        parser.error(f"argument --buffer/--link-rate: {e}")
    bad = [b for b in buffers if not MIN_BUFFER <= b <= MAX_SIZE]
    if bad:
        parser.error(f"argument --buffer: {bad[0]} is not between 4KiB and 1TiB")
    try:
        requests, rtt = int(args.requests), float(args.rtt_ms) / 1000
    except ValueError:
        parser.error(f"argument --requests/--rtt-ms: not a number: {args.requests!r}, {args.rtt_ms!r}")
    if not 1 <= requests <= 256 or not 0 < rtt <= 10:
        parser.error("argument --requests must be 1 to 256 and --rtt-ms above 0 and at most 10000")
    return format_objects([advise_objects(b, requests, rtt, CONN_RATE, link) for b in buffers], rtt)
