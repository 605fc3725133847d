"""``shufflefs demo``: mount a generated dataset and show two epochs."""

from __future__ import annotations

import argparse


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..demo import run_demo

    return run_demo(args.dir, keep=args.keep)
