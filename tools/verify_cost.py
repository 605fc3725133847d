#!/usr/bin/env python3
"""What the checks of every gathered window cost, per format, through real mounts.

    python tools/verify_cost.py [--mib 128] [--rounds 5] [--strategy corgipile] [--formats jsonl,csv,...]

Writes one file per format (JSON lines of ~1 KiB, CSV rows of ~1 KiB with quoted fields, an
``.npy`` of 1 KiB rows, fixed 1 KiB records, TFRecord frames of 1-4 KiB, a WebDataset tar of
two-member samples of 1-4 KiB each) and mounts the tree three times in one run:

* ``off``: ``--verify index`` with ``SHUFFLEFS_FRAMING=off`` in the daemon's environment (an
  internal switch that exists only for this measurement: no window check at all);
* ``framing``: ``--verify index``, the framing checks alone;
* ``frames``: ``--verify frames`` (the default): framing, plus TFRecord CRCs.

It warms the page cache and every mount's index, then reads every view of every mount with 1 MiB
reads, in rotating order, a new epoch every round.  Prints each mode's median GB/s per format and
the median of the per-round ratios to ``off`` (1.0 = free).  Then, in this process, the CPU time
of each check against the CPU time of building the same windows (`View.load_window`, corgipile,
64 MiB windows, with the check and without): what the checks cost on a busy machine, where the
mounts' rates are noisy.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import sys
import tarfile
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.proc import FuseDaemon  # noqa: E402
from shufflefs.formats import gather_check, make_format, resolve_format, scan_file  # noqa: E402
from shufflefs.formats.base import FRAMING_ENV  # noqa: E402
from shufflefs.strategies import ShuffleSpec, make_plan  # noqa: E402
from shufflefs.windows.view import View  # noqa: E402
from shufflefs.formats.tfrecord import encode_frame  # noqa: E402

MiB = 1 << 20
RECORD = 1024
MODES = {"off": ["--verify", "index"], "framing": ["--verify", "index"], "frames": ["--verify", "frames"]}
NAMES = {"jsonl": "d.jsonl", "csv": "d.csv", "npy": "d.npy", "fixed": "d.bin", "tfrecord": "d.tfrecord",
         "tar": "d.tar"}


def _tiled(lines: list[bytes], nbytes: int, head: bytes = b"") -> bytes:
    block = b"".join(lines)
    return head + block * max(1, nbytes // len(block))


def write_files(src: Path, nbytes: int, formats: list[str]) -> None:
    rng = np.random.default_rng(0)
    for fmt in formats:
        path = src / NAMES[fmt]
        if fmt == "jsonl":
            lines = [json.dumps({"id": i, "text": "x" * int(rng.integers(800, 1200))}).encode() + b"\n"
                     for i in range(4096)]
            path.write_bytes(_tiled(lines, nbytes))
        elif fmt == "csv":
            rows = [b'%d,"quoted, with ""quotes""\nand a newline",%s\n' % (i, b"y" * int(rng.integers(800, 1200)))
                    for i in range(4096)]
            path.write_bytes(_tiled(rows, nbytes, b"id,text,pad\n"))
        elif fmt == "npy":
            np.save(path, np.zeros((nbytes // RECORD, RECORD // 4), np.float32))
        elif fmt == "fixed":
            path.write_bytes(bytes(nbytes // RECORD * RECORD))
        elif fmt == "tfrecord":
            with open(path, "wb") as f:
                written = 0
                while written < nbytes:
                    frame = encode_frame(rng.integers(0, 256, int(rng.integers(1024, 4096)), np.uint8).tobytes())
                    f.write(frame)
                    written += len(frame)
        elif fmt == "tar":
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
                i = 0
                while t.offset < nbytes:
                    for ext in ("jpg", "cls"):
                        data = bytes(int(rng.integers(1024, 4096)))
                        info = tarfile.TarInfo(f"s{i:08d}.{ext}")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
                    i += 1


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


def check_cpu(path: Path, strategy: str, rounds: int = 3) -> tuple[float, float, float]:
    """CPU seconds of loading every window of one epoch: ``(load without a check, what the
    framing check adds, what the full check adds)``, the least of ``rounds`` interleaved rounds.
    The framing check runs inside the compiled gather as records are copied, so what it costs is
    the difference between loads with and without it."""
    fmt = resolve_format(path.name, [], {"record_size": RECORD}) or make_format("fixed", {"record_size": RECORD})
    index = scan_file(path, fmt)
    plan = make_plan(index, ShuffleSpec(strategy, seed=1), 1)
    checks = [None, gather_check(fmt, "index"), gather_check(fmt, "frames")]
    best = [float("inf")] * len(checks)
    for _ in range(rounds):
        for i, check in enumerate(checks):
            view = View(str(path), index, plan, check=check)
            spent, out, scratch = 0.0, None, None
            try:
                for k in range(plan.n_windows):
                    t0 = time.thread_time()
                    window, scratch = view.load_window(k, out, scratch)
                    spent += time.thread_time() - t0
                    out = window.base if window.base is not None else window
            finally:
                view.close()
            best[i] = min(best[i], spent)
    return best[0], max(best[1] - best[0], 0.0), max(best[2] - best[0], 0.0)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount in the finally blocks on a kill
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=128, help="MiB per format's file")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--strategy", default="corgipile")
    ap.add_argument("--formats", default=",".join(NAMES))
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    with tempfile.TemporaryDirectory(prefix="verify-cost-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        src = work / "src"
        src.mkdir()
        write_files(src, args.mib * MiB, formats)
        mounts = {}
        for mode, opts in MODES.items():
            mnt = work / f"mnt-{mode}"
            mnt.mkdir()
            cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(src), str(mnt), "--strategy", args.strategy,
                   "--record-size", str(RECORD), *opts, "--cache-dir", str(work / f"cache-{mode}")]
            env = dict(os.environ, PYTHONPATH=str(REPO))
            env.pop(FRAMING_ENV, None)
            if mode == "off":
                env[FRAMING_ENV] = "off"
            mounts[mode] = stack.enter_context(FuseDaemon(cmd, mnt, work / f"{mode}.log", env=env))
        for d in mounts.values():  # index, warm page cache and windows' memory
            for fmt in formats:
                read(d.mountpoint / NAMES[fmt])
        rates = {(fmt, mode): [] for fmt in formats for mode in MODES}
        order = list(MODES)
        for r in range(args.rounds):
            for d in mounts.values():
                os.setxattr(d.mountpoint, "user.shufflefs.epoch", str(r + 1).encode())
            time.sleep(1.0)  # a new epoch prepares the views opened last in the background: not timed
            for fmt in formats:
                for mode in order[r % len(order):] + order[: r % len(order)]:
                    n, s = read(mounts[mode].mountpoint / NAMES[fmt])
                    rates[fmt, mode].append(n / s / 1e9)
            print(f"round {r} done", file=sys.stderr)
        print(f"{args.mib} MiB per file, {args.strategy}, warm, 1 MiB reads, {args.rounds} rounds (median)")
        print("| format | off GB/s | framing GB/s | frames GB/s | framing / off | frames / off |")
        print("|---|---|---|---|---|---|")
        for fmt in formats:
            med = {m: statistics.median(rates[fmt, m]) for m in MODES}
            ratio = {m: statistics.median(a / b for a, b in zip(rates[fmt, m], rates[fmt, "off"])) for m in MODES}
            print(f"| {fmt} | {med['off']:.2f} | {med['framing']:.2f} | {med['frames']:.2f} "
                  f"| {ratio['framing']:.2f} | {ratio['frames']:.2f} |")
        for d in mounts.values():
            d.stop()
        print("\nCPU time of the checks against building the same windows (one epoch, in this process)")
        print("| format | load s | framing check s | full check s | framing / load | full / load |")
        print("|---|---|---|---|---|---|")
        for fmt in formats:
            load, framing, full = check_cpu(src / NAMES[fmt], args.strategy)
            print(f"| {fmt} | {load:.3f} | {framing:.3f} | {full:.3f} | {framing / load:.1%} | {full / load:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
