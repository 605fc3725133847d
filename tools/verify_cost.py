#!/usr/bin/env python3
"""What checking every TFRecord frame's checksums at window gather costs, through real mounts.

    python tools/verify_cost.py [--mib 256] [--rounds 5] [--strategy corgipile]

Writes a TFRecord file of 1-4 KiB frames, mounts it twice in one run (``--verify frames``, the
default, and ``--verify index``), warms the page cache, then reads both views with 1 MiB reads,
alternating, a new epoch every round.  Prints each round's GB/s and the median ratio
frames / index (1.0 = free).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.proc import FuseDaemon  # noqa: E402
from shufflefs.formats.tfrecord import encode_frame  # noqa: E402

MiB = 1 << 20


def write_tfrecord(path: Path, nbytes: int) -> int:
    rng = np.random.default_rng(0)
    n = 0
    with open(path, "wb") as f:
        written = 0
        while written < nbytes:
            payload = rng.integers(0, 256, int(rng.integers(1024, 4096)), dtype=np.uint8).tobytes()
            frame = encode_frame(payload)
            f.write(frame)
            written += len(frame)
            n += 1
    return n


def read(path: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, MiB)
            if not b:
                break
            total += len(b)
    finally:
        os.close(fd)
    return total, time.perf_counter() - t0


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount in the finally blocks on a kill
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--strategy", default="corgipile")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="verify-cost-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        src = work / "src"
        src.mkdir()
        frames = write_tfrecord(src / "d.tfrecord", args.mib * MiB)
        mounts = {}
        for mode in ("frames", "index"):
            mnt = work / f"mnt-{mode}"
            mnt.mkdir()
            cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(src), str(mnt), "--strategy", args.strategy,
                   "--verify", mode, "--cache-dir", str(work / "cache")]
            env = dict(os.environ, PYTHONPATH=str(REPO))
            mounts[mode] = stack.enter_context(FuseDaemon(cmd, mnt, work / f"{mode}.log", env=env))
        for mode, d in mounts.items():  # index, warm page cache and windows' memory
            read(d.mountpoint / "d.tfrecord")
        rates: dict[str, list[float]] = {"frames": [], "index": []}
        for r in range(args.rounds):
            for mode, d in mounts.items():
                os.setxattr(d.mountpoint, "user.shufflefs.epoch", str(r + 1).encode())
                n, s = read(d.mountpoint / "d.tfrecord")
                rates[mode].append(n / s / 1e9)
            print(f"round {r}: frames {rates['frames'][-1]:.2f} GB/s, index {rates['index'][-1]:.2f} GB/s")
        ratio = statistics.median(a / b for a, b in zip(rates["frames"], rates["index"]))
        print(f"{frames} frames, {args.mib} MiB, {args.strategy}: median frames/index throughput {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
