"""How well each strategy mixes a mixture's sources, at the sizes users keep, without files.

Offset tables of three synthetic sources (web: 4 files of 250,000 records of ~600 bytes; books:
20,000 of ~5 KB; code: 2 files of 100,000 of ~1.5 KB; 1.1 GB in all) make the pool a mixture
draws from; the blend takes 600,000 records at 5 : 2 : 3.  For every strategy, with the mount's
defaults (64 MiB buffer, automatic blocks), the epoch's order is planned as a mount plans it and
cut into stretches of 1,000 records: how far each source's share in a stretch is from its share
in the blend (mean and worst), against the same for ``full`` (a uniform shuffle of the same
records) computed in the same run.

    python tools/bench.py --only mix-quality [--samples 600000] [--epoch 1] [--seed 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shufflefs.index.table import RecordIndex  # noqa: E402
from shufflefs.index.joined_index import PooledIndex  # noqa: E402
from shufflefs.pools.mix_index import epoch_index  # noqa: E402
from shufflefs.strategies import ShuffleSpec, make_plan  # noqa: E402

STRATEGIES = ("stratified", "corgipile", "block", "none", "full")


def synthetic(n: int, mean: int, rng: np.random.Generator) -> RecordIndex:
    lengths = rng.integers(mean // 2, mean * 3 // 2, n)
    bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    return RecordIndex(int(bounds[-1]), bounds)


def deviation(seq: np.ndarray, k: int) -> tuple[float, float]:
    share = np.bincount(seq, minlength=k) / len(seq)
    m = len(seq) // 1000 * 1000
    counts = np.stack([np.bincount(r, minlength=k) for r in seq[:m].reshape(-1, 1000)]) / 1000
    d = np.abs(counts - share)
    return float(d.mean()), float(d.max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=600_000)
    ap.add_argument("--epoch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    members = ([synthetic(250_000, 600, rng) for _ in range(4)] + [synthetic(20_000, 5000, rng)]
               + [synthetic(100_000, 1500, rng) for _ in range(2)])
    base = PooledIndex(members)
    firsts, weights = [0, 4, 5, 7], [5, 2, 3]
    starts = base.member_firsts[firsts]
    print(f"{base.n:,} records, {base.data_bytes / 1e9:.2f} GB in 3 sources; blend of {args.samples:,} at 5:2:3")
    print("| strategy | windows | share off per 1,000, mean | worst | x full (mean) | seconds to plan |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for strategy in STRATEGIES:
        spec = ShuffleSpec(strategy=strategy, seed=args.seed)
        t = time.perf_counter()
        mix = epoch_index(base, firsts, weights, args.samples, spec, args.epoch)
        plan = make_plan(mix, spec, args.epoch)
        order = np.concatenate([plan.window(k) for k in range(plan.n_windows)])
        took = time.perf_counter() - t
        source = np.searchsorted(starts, mix.base_ids_of(order), side="right") - 1
        rows[strategy] = (plan.n_windows, *deviation(source, 3), took)
    full = rows["full"][1]
    for strategy, (windows, mean, worst, took) in rows.items():
        print(f"| {strategy} | {windows} | {mean:.4f} | {worst:.3f} | {mean / full:.2f} | {took:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
