#!/usr/bin/env python3
"""Read throughput of every strategy's view against a raw read of the same file, in one run.

    python tools/throughput.py [--size 256MiB] [--dir DIR] [--strategies none,corgipile,...]

Generates a JSONL file of ~1 KiB records (or reuses it), then for each strategy mounts it, reads
the whole view twice with 1 MiB and with 128 KiB reads (warm page cache for the source), and
prints GB/s and the ratio to the raw read of the source measured in the same run.  Every mount is
unmounted in a ``finally``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from shufflefs.config import parse_size
from shufflefs.strategies import STRATEGIES


def make_jsonl(path: Path, size: int, seed: int = 0) -> None:
    rnd = np.random.default_rng(seed)
    written, i = 0, 0
    with open(path, "wb") as f:
        while written < size:
            pads = rnd.integers(800, 1200, 4096)
            chunk = b"".join(b'{"id": %d, "pad": "%s"}\n' % (i + j, b"x" * int(p)) for j, p in enumerate(pads))
            f.write(chunk)
            written += len(chunk)
            i += len(pads)


def read_all(path: Path, bufsize: int) -> tuple[int, float]:
    """Bytes read and seconds, reading front to back with ``bufsize`` reads into one buffer."""
    buf = bytearray(bufsize)
    total = 0
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    try:
        while n := os.readv(fd, [buf]):
            total += n
    finally:
        os.close(fd)
    return total, time.perf_counter() - t0


def best_rate(path: Path, bufsize: int, repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        n, dt = read_all(path, bufsize)
        rates.append(n / dt / 1e9)
    return max(rates)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB", help="dataset size (default 256MiB)")
    ap.add_argument("--dir", type=Path, help="work directory (default: a temporary one, removed)")
    ap.add_argument("--strategies", default=",".join(sorted(STRATEGIES)))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("mount_args", nargs="*", help="extra `shufflefs mount` options, after --")
    args = ap.parse_args()

    work = args.dir or Path(tempfile.mkdtemp(prefix="shufflefs-bench-"))
    src, mnt, cache = work / "src", work / "mnt", work / "cache"
    for d in (src, mnt, cache):
        d.mkdir(parents=True, exist_ok=True)
    data = src / "data.jsonl"
    if not data.exists() or data.stat().st_size < parse_size(args.size):
        make_jsonl(data, parse_size(args.size))
    cmd = [sys.executable, "-m", "shufflefs"]
    try:
        raw1 = best_rate(data, 1 << 20, args.repeat)
        raw128 = best_rate(data, 128 << 10, args.repeat)
        print(f"dataset {data} ({data.stat().st_size / 1e6:.0f} MB)")
        print(f"{'read':<12} {'1MiB GB/s':>10} {'x raw':>7} {'128KiB GB/s':>12} {'x raw':>7}")
        print(f"{'raw source':<12} {raw1:>10.2f} {1:>7.2f} {raw128:>12.2f} {1:>7.2f}")
        for strategy in args.strategies.split(","):
            subprocess.run([*cmd, "mount", str(src), str(mnt), "--strategy", strategy,
                            "--cache-dir", str(cache), *args.mount_args], check=True)
            try:
                r1 = best_rate(mnt / data.name, 1 << 20, args.repeat)
                r128 = best_rate(mnt / data.name, 128 << 10, args.repeat)
            finally:
                subprocess.run([*cmd, "umount", str(mnt)], check=True)
            print(f"{strategy:<12} {r1:>10.2f} {r1 / raw1:>7.2f} {r128:>12.2f} {r128 / raw128:>7.2f}")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
