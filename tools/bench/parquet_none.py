"""The Parquet benchmark's default view against the `none` view of the same file, in one run.

Shuffling is judged by quality and speed together: the default order (`stratified`) and
``--strategy none`` (the source's order, the same view encoding and stage machinery) are mounted
side by side; each view's label mix is what ``shufflefs inspect VIEW --label-field label`` reports
(with the uniform shuffle's in the same report), and each is read warm with the benchmark's
``iterate``, one epoch each per round, which view goes first alternating, so the ratio is the
cost of the order alone.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

from .proc import FuseDaemon

WARMUP = 2
"""Epochs of each view read before the rounds: the index and the decoded copy."""


def inspect_mix(view: Path, env: dict) -> tuple[float, float, float]:
    """(label mix per 100 rows, a uniform shuffle's, rank correlation) of ``view``, by `shufflefs inspect`."""
    got = subprocess.run([sys.executable, "-m", "shufflefs", "inspect", str(view), "--label-field", "label", "--json"],
                         capture_output=True, text=True, env=env, timeout=600, check=True)
    j = json.loads(got.stdout)
    (mine,) = j["strategies"].values()
    return float(mine["label_tv"]), float(j["uniform"]["label_tv"]), float(mine["rank_corr"])


def against_none(src_dir: Path, name: str, data: Path, cache: Path, env: dict, rounds: int,
                 iterate: Callable[[Path], tuple]) -> list[str]:
    """The section's lines: a table of the default and the `none` view (rows/s, x none, label mix)."""
    kinds = {"default (`stratified`, 64 MiB buffer)": [], "`--strategy none`": ["--strategy", "none"]}
    daemons, views = [], {}
    try:
        for k, (kind, args) in enumerate(kinds.items()):
            mnt = data / f"mnt-{k}"
            mnt.mkdir(exist_ok=True)
            cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(src_dir), str(mnt), "--cache-dir", str(cache),
                   *args]
            daemons.append(FuseDaemon(cmd, mnt, data / "daemon.log", env).start())
            views[kind] = mnt / name
        mixes = {kind: inspect_mix(view, env) for kind, view in views.items()}
        rates: dict[str, list[float]] = {kind: [] for kind in views}
        ratios = []
        for e in range(WARMUP + rounds):
            got = {}
            for kind in (list(views) if e % 2 == 0 else list(reversed(views))):
                os.setxattr(views[kind], "user.shufflefs.epoch", str(e).encode())
                n, t = iterate(views[kind])[:2]
                got[kind] = n / t
            if e >= WARMUP:
                for kind, r in got.items():
                    rates[kind].append(r)
                ratios.append(got[next(iter(views))] / got[list(views)[1]])
    finally:
        for d in reversed(daemons):
            d.stop()
    lines = [f"The default view against the `none` view of the same file, mounted side by side (warm, one "
             f"`iter_batches` epoch of each a round, which goes first alternating; median of {rounds}; label mix "
             f"by `shufflefs inspect VIEW --label-field label`, the uniform shuffle's from the same report; per "
             f"round, default / none: {', '.join(f'{x:.2f}' for x in ratios)}):", "",
             "| view | rows/s | x none | label mix /100 (uniform) | rank correlation |", "|---|---|---|---|---|"]
    for kind in views:
        mix, uniform, corr = mixes[kind]
        rate = statistics.median(rates[kind])
        x = statistics.median(ratios) if kind == next(iter(views)) else 1.0
        lines.append(f"| {kind} | {rate:,.0f} | {x:.2f} | {mix:.3f} ({uniform:.3f}) | {corr:.4f} |")
    return lines
