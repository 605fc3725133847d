#!/usr/bin/env python3
"""Per-step load imbalance across ranks, with and without ``--balance``, read through real mounts.

    python tools/imbalance.py [--records N] [--world W] [--batch B] [--levels 0,0.5,1]
                              [--field tokens] [--data FILE] [--epochs E] [--out FILE]

Generates (or takes, ``--data``) a JSON lines file whose records vary in length like text
samples (log-normal token counts, a ``tokens`` field and that many characters of text).  For each
setting it mounts the file W times (``--rank 0..W-1 --world-size W``), reads every rank's view
with ``cat``, checks that the ranks together read every record exactly once, and cuts each
rank's records into batches of B.  Step i's imbalance is the largest batch cost among the ranks
over the smallest (cost = record bytes, or the ``--field`` value): the slowest rank's wait on
every step of synchronous data-parallel training.  Reported per setting: the mean, median, 95th
percentile and worst step, averaged over ``--epochs`` epochs, and the ratio of mean imbalance
to unbalanced ``full`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shufflefs.strategies.balance import step_imbalance  # noqa: E402


def make_data(path: Path, n: int, seed: int) -> None:
    """Records of log-normal length (median ~200 tokens, a long tail), like text samples."""
    rng = np.random.default_rng(seed)
    tokens = np.clip(rng.lognormal(5.3, 0.8, n), 1, 4000).astype(int)
    with open(path, "wb") as f:
        for i, t in enumerate(tokens.tolist()):
            f.write(json.dumps({"id": i, "tokens": t, "text": "w" * t}).encode() + b"\n")


def shufflefs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "shufflefs", *args], check=True, cwd=REPO)


def read_ranks(src: Path, work: Path, world: int, options: list[str], epochs: int) -> list[list[bytes]]:
    """Every epoch's views of the W ranks, each mounted and unmounted here."""
    out: list[list[bytes]] = [[] for _ in range(epochs)]
    with ExitStack() as stack:
        mounts = []
        for r in range(world):
            mnt = Path(tempfile.mkdtemp(dir=work, prefix=f"r{r}-"))
            shufflefs("mount", str(src.parent), str(mnt), "--cache-dir", str(work / "cache"),
                      "--rank", str(r), "--world-size", str(world), *options)
            stack.callback(shufflefs, "umount", str(mnt))
            mounts.append(mnt)
        for e in range(epochs):
            for mnt in mounts:
                os.setxattr(mnt, "user.shufflefs.epoch", str(e).encode())
                out[e].append(subprocess.run(["cat", str(mnt / src.name)], check=True, capture_output=True).stdout)
    return out


def costs_of(views: list[bytes], field: str | None) -> tuple[np.ndarray, list[np.ndarray]]:
    """All records' costs (by record) and each rank's order as indexes into them."""
    records = [v.splitlines(keepends=True) for v in views]
    flat = [x for rec in records for x in rec]
    if field is None:
        costs = np.fromiter(map(len, flat), np.int64, len(flat))
    else:
        costs = np.array([json.loads(x)[field] for x in flat], dtype=np.float64)
    edges = np.cumsum([0] + [len(r) for r in records])
    return costs, [np.arange(edges[r], edges[r + 1]) for r in range(len(views))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records to generate (default 100000)")
    ap.add_argument("--data", type=Path, help="a JSON lines file to use instead (with --field if it has one)")
    ap.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--batch", type=int, default=32, help="records per step per rank (default 32)")
    ap.add_argument("--levels", default="0,0.5,1", help="random_level values to balance with (default 0,0.5,1)")
    ap.add_argument("--field", default=None, help="balance and measure by this numeric field (default: bytes)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per setting (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="shufflefs-imbalance-") as tmp:
        work = Path(tmp)
        if args.data is not None:
            src = args.data.resolve()  # its directory is mounted (read-only, like any source)
        else:
            src = work / "src" / "data.jsonl"
            src.parent.mkdir()
            make_data(src, args.records, args.seed)
        source = sorted(src.read_bytes().splitlines(keepends=True))
        balance = ["--balance-field", args.field] if args.field else ["--balance"]
        settings = [("full (unbalanced)", ["--strategy", "full"]),
                    # small blocks, so that every rank gets many of them even from a small file
                    ("corgipile 64KiB blocks (unbalanced)", ["--strategy", "corgipile", "--block-size", "64KiB"])]
        settings += [(f"full --balance, random_level {lv}", ["--strategy", "full", *balance, "--random-level", lv])
                     for lv in args.levels.split(",")]
        rows = []
        for name, options in settings:
            stats = []
            for views in read_ranks(src, work, args.world, options, args.epochs):
                if sorted(x for v in views for x in v.splitlines(keepends=True)) != source:
                    raise SystemExit(f"{name}: the ranks did not read every record exactly once")
                costs, orders = costs_of(views, args.field)
                r = step_imbalance(costs, orders, args.batch)
                stats.append([r.mean(), np.median(r), np.percentile(r, 95), r.max(), len(r)])
            rows.append((name, np.mean(stats, axis=0)))
            print(f"{name:<36} mean {rows[-1][1][0]:.3f}", flush=True)
    base = rows[0][1][0]
    unit = args.field or "bytes"
    lines = [f"Per-step imbalance: max/min {unit} of the i-th batch across {args.world} ranks, batch {args.batch}, "
             f"mean over {args.epochs} epochs (read through {args.world} mounts per setting).", "",
             "| setting | steps | mean | median | p95 | worst | mean over full's |", "|---|---|---|---|---|---|---|"]
    for name, (mean, med, p95, worst, steps) in rows:
        lines.append(f"| {name} | {steps:.0f} | {mean:.3f} | {med:.3f} | {p95:.3f} | {worst:.3f} | {mean / base:.3f} |")
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
