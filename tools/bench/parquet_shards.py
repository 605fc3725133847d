"""The Parquet benchmark's file as a Hub-style set of shards, read one after the other each epoch.

Datasets on the Hugging Face Hub ship as ``train-0000k-of-0000n.parquet``: a mount pools such a
set (one order over all its rows, each shard showing its part) and a reader opens the shards in
turn.  Each shard's stage is then built while the shards before it are read (`EpochPrep.ahead`),
not at its open.  Measured as the single file's warm rows are (`parquet_views.run`): blocks of
epochs back to back against the same loop over the source shards, the order of the two
alternating; the first epoch of a block, whose epoch jumps from the block before, timed apart.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from .parquet_peers import label_mix
from .proc import FuseDaemon, Sampler

SHARDS = 4
EPOCHS = 3
"""Epochs a round reads of each, back to back: of the view, after the block's first epoch."""


def make_shards(src: Path, into: Path, shards: int = SHARDS) -> list[str]:
    """``src`` cut into ``shards`` files of consecutive rows (so each is label-sorted too), row
    groups as in ``src``; written once.  Their names, in order."""
    import pyarrow.parquet as pq

    into.mkdir(parents=True, exist_ok=True)
    names = [f"train-{k:05d}-of-{shards:05d}.parquet" for k in range(shards)]
    if all((into / n).exists() and (into / n).stat().st_mtime >= src.stat().st_mtime for n in names):
        return names
    pf = pq.ParquetFile(src)
    table = pf.read()
    rows = pf.metadata.row_group(0).num_rows
    for k, name in enumerate(names):
        a, b = k * table.num_rows // shards, (k + 1) * table.num_rows // shards
        tmp = into / f".{name}.tmp"
        pq.write_table(table.slice(a, b - a), tmp, row_group_size=rows)
        os.replace(tmp, into / name)
    return names


def shard_rounds(cmd: list[str], src_dir: Path, mnt: Path, log: Path, env: dict, names: list[str],
                 rounds: int, iterate) -> tuple[list[tuple], list[float]]:
    """Per round: (view rows/s, source rows/s, daemon usage, label mix) of `EPOCHS` epochs over the
    shards in turn (``iterate`` each: rows, seconds, labels), the view's epochs set on the mount
    root in the timed loop after the block's first epoch; and per round, the rows/s of that first
    epoch (its epoch set in its time), whose stages nothing built ahead."""
    import numpy as np

    def epoch(root: Path) -> tuple[int, np.ndarray]:
        got = [iterate(root / name) for name in names]
        return sum(g[0] for g in got), np.concatenate([g[2] for g in got])

    out, firsts = [], []
    with FuseDaemon(cmd, mnt, log, env) as d:
        for e in range(2):  # the index and the copies; an epoch that learns the order the shards are read in
            os.setxattr(mnt, "user.shufflefs.epoch", str(e).encode())
            epoch(mnt)
        for r in range(rounds):
            got = {}
            for what in (("source", "view") if r % 2 == 0 else ("view", "source")):
                if what == "source":
                    t0, n = time.perf_counter(), 0
                    for _ in range(EPOCHS):
                        n += epoch(src_dir)[0]
                    got[what] = n / (time.perf_counter() - t0)
                    continue
                first = 10 * (r + 1)
                t0 = time.perf_counter()
                os.setxattr(mnt, "user.shufflefs.epoch", str(first).encode())
                firsts.append(epoch(mnt)[0] / (time.perf_counter() - t0))
                with Sampler(d.pid) as s:
                    t0, n = time.perf_counter(), 0
                    for e in range(first + 1, first + 1 + EPOCHS):
                        os.setxattr(mnt, "user.shufflefs.epoch", str(e).encode())
                        m, labels = epoch(mnt)
                        n += m
                    got[what] = n / (time.perf_counter() - t0)
                usage = s.usage
            out.append((got["view"], got["source"], dataclasses.replace(usage, cpu_s=usage.cpu_s / EPOCHS), label_mix(labels)[0]))
    return out, firsts
