"""Serving modes: the default (every view through the page cache, so shared mappings work)
against ``--direct-io`` (views but npy and fixed-size ones bypass the page cache), on one machine.

The ``none`` and ``corgipile`` views of the JSON lines dataset are mounted in both modes at once
(four daemons) and read warm, 1 MiB reads, one after the other in an order rotated every round,
each at a new epoch (a new inode: nothing is served from an earlier pass's pages); the view's
pages are dropped after each pass so that the page cache holds what it would in training (the
source and the current epoch).  Ratios are medians over rounds of the ratio within each round,
so drift on a shared machine falls on both sides alike: default / ``--direct-io`` per strategy,
and ``corgipile`` / ``none`` per mode.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from pathlib import Path
from typing import Any

from bench import proc, reads
from bench.paired import median_ratio

EPOCH_ATTR = "user.shufflefs.epoch"
MODES = {"default": (), "direct-io": ("--direct-io",)}
STRATEGIES = ("none", "corgipile")
TARGET = 0.85
"""corgipile / none in the default mode that the section's verdict asks for."""


class Serving:
    """The serving-mode rounds of one benchmark run (``bench``: the run's `Bench`)."""

    def __init__(self, bench: Any, rounds: int) -> None:
        self.b = bench
        self.rounds = rounds
        self.rates: dict[str, list[float]] = {}  # "mode/strategy" -> GB/s per round
        self.readahead: dict[str, str] = {}
        self.lines: list[str] = []
        self.epoch = 20_000

    def _pass(self, mnt: Path, name: str) -> float:
        self.epoch += 1
        os.setxattr(mnt, EPOCH_ATTR, str(self.epoch).encode())
        path = mnt / name
        r = reads.read_chunks(path, 1 << 20, self.b.args.max_seconds)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return r.nbytes / r.seconds / 1e9 if r.seconds else 0.0

    def run(self) -> None:
        b = self.b
        ds = next((d for d in b.datasets if d.name == "lines"), None)
        if ds is None:
            self.lines = ["Not run: needs the lines dataset."]
            return
        source = ds.path
        with contextlib.ExitStack() as stack:
            mounts: dict[str, Path] = {}
            for mode, extra in MODES.items():
                for strategy in STRATEGIES:
                    key = f"{mode}/{strategy}"
                    mnt = b.work / f"mnt-serving-{mode}-{strategy}"
                    mnt.mkdir(exist_ok=True)
                    cmd = b.shufflefs_cmd(b.src, mnt, strategy, *extra, "--log-file",
                                          str(b.logs / f"serving-{mode}-{strategy}.log"))
                    stack.enter_context(proc.FuseDaemon(cmd, mnt, b.logs / f"serving-{mode}-{strategy}.out", env=b.env))
                    mounts[key] = mnt
            reads.warm(source)
            for key, mnt in mounts.items():  # the first pass of a mount (index load) is not measured
                self._pass(mnt, source.name)
                self.readahead[key] = readahead_kb(mnt)
            names = list(mounts)
            self.rates = {n: [] for n in names}
            for r in range(self.rounds):
                shift = r % len(names)
                for key in names[shift:] + names[:shift]:
                    reads.warm(source)
                    self.rates[key].append(self._pass(mounts[key], source.name))
                b.say(f"serving round {r + 1}: " + ", ".join(f"{n} {self.rates[n][-1]:.2f}" for n in names))
        self._write(source.name)

    def ratio(self, a: str, b: str) -> tuple[float, list[float]] | None:
        return median_ratio(self.rates, a, b)

    def _write(self, name: str) -> None:
        def cell(r: tuple[float, list[float]] | None) -> str:
            return "-" if r is None else f"{r[0]:.2f}x ({', '.join(f'{x:.2f}' for x in r[1])})"

        out = [f"{name}, warm, 1 MiB reads, {self.rounds} rounds; all four mounts at once, read in an order "
               "rotated every round, each pass at a new epoch. Median GB/s (per round) and median of "
               "per-round ratios:", "",
               "| mode | none GB/s | corgipile GB/s | corgipile / none | read_ahead_kb |", "|---|---|---|---|---|"]
        for mode in MODES:
            med = {s: statistics.median(self.rates[f"{mode}/{s}"]) for s in STRATEGIES}
            rounds = {s: ", ".join(f"{x:.2f}" for x in self.rates[f"{mode}/{s}"]) for s in STRATEGIES}
            label = "default (page cache)" if mode == "default" else "`--direct-io`"
            out.append(f"| {label} | {med['none']:.2f} ({rounds['none']}) | {med['corgipile']:.2f} "
                       f"({rounds['corgipile']}) | {cell(self.ratio(f'{mode}/corgipile', f'{mode}/none'))} | "
                       f"{self.readahead.get(f'{mode}/none', '?')} |")
        out += ["", "| default / `--direct-io` | ratio (per round) |", "|---|---|"]
        for s in STRATEGIES:
            out.append(f"| {s} | {cell(self.ratio(f'default/{s}', f'direct-io/{s}'))} |")
        r = self.ratio("default/corgipile", "default/none")
        verdict = "-" if r is None else ("met" if r[0] >= TARGET else "NOT met")
        out += ["", f"Default corgipile / none >= {TARGET}x: {'-' if r is None else f'{r[0]:.2f}x'}, {verdict}."]
        self.lines = out


def readahead_kb(mnt: Path) -> str:
    dev = os.stat(mnt).st_dev
    try:
        return Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb").read_text().strip()
    except OSError:
        return "?"
