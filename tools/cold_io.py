"""Cold reads of a block shuffle at queue depth: which way of reading a window's blocks is fastest
on this machine's storage, against a sequential read of the same file.

    sudo python tools/cold_io.py [--size 2GiB] [--block 4MiB] [--window 64MiB] [--dir DIR]

Every mode reads the same bytes (all blocks of the file, in one random block order, windows of
``--window`` bytes) after the page cache is dropped, and reports GB/s and the ratio to the
sequential read measured in the same run:

  sequential      1 MiB preads front to back (what ``cat`` gets with the kernel's readahead)
  qd1             each window's blocks in ascending order, 1 MiB preads (one request at a time)
  hint-next       qd1, and POSIX_FADV_WILLNEED on the next window's blocks after each window
  hint-window     WILLNEED on all of a window's blocks, then qd1 over them
  threads-N       N threads each preading whole blocks of the window (and the next window's,
                  while the window is consumed), into per-thread buffers
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shufflefs.config import parse_size  # noqa: E402

CHUNK = 1 << 20


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_block(fd: int, start: int, size: int, buf: memoryview) -> int:
    got = 0
    while got < size:
        n = os.preadv(fd, [buf[: min(CHUNK, size - got)]], start + got)
        if n <= 0:
            break
        got += n
    return got


def windows(order: np.ndarray, per_window: int) -> list[np.ndarray]:
    return [np.sort(order[i: i + per_window]) for i in range(0, len(order), per_window)]


def mode_sequential(fd: int, size: int, **_) -> int:
    buf = memoryview(bytearray(CHUNK))
    return sum(read_block(fd, off, min(CHUNK, size - off), buf) for off in range(0, size, CHUNK))


def mode_qd1(fd: int, size: int, wins: list[np.ndarray], block: int, hint: str = "", **_) -> int:
    buf = memoryview(bytearray(CHUNK))
    total = 0
    for w, blocks in enumerate(wins):
        if hint == "window":
            for b in blocks.tolist():
                os.posix_fadvise(fd, b * block, block, os.POSIX_FADV_WILLNEED)
        for b in blocks.tolist():
            total += read_block(fd, b * block, block, buf)
        if hint == "next" and w + 1 < len(wins):
            for b in wins[w + 1].tolist():
                os.posix_fadvise(fd, b * block, block, os.POSIX_FADV_WILLNEED)
    return total


def mode_threads(fd: int, size: int, wins: list[np.ndarray], block: int, threads: int, **_) -> int:
    """Blocks of window k and k+1 in flight on ``threads`` readers; the window is done when all
    its blocks are (as a window load would wait for them)."""
    bufs = [memoryview(bytearray(block)) for _ in range(threads * 3)]
    free = list(range(len(bufs)))
    total = 0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        def submit(blocks: np.ndarray) -> list:
            out = []
            for b in blocks.tolist():
                i = free.pop() if free else None
                buf = bufs[i] if i is not None else memoryview(bytearray(block))
                out.append((pool.submit(read_block, fd, b * block, block, buf), i))
            return out

        pending = submit(wins[0]) if wins else []
        for w in range(len(wins)):
            ahead = submit(wins[w + 1]) if w + 1 < len(wins) else []
            for fut, i in pending:
                total += fut.result()
                if i is not None:
                    free.append(i)
            pending = ahead
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB")
    p.add_argument("--block", default="4MiB")
    p.add_argument("--window", default="64MiB")
    p.add_argument("--threads", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    size, block, window = parse_size(args.size), parse_size(args.block), parse_size(args.window)
    size -= size % block
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "data.bin"
        with open(path, "wb") as f:
            chunk = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
            for off in range(0, size, len(chunk)):
                f.write(chunk[: min(len(chunk), size - off)])
        order = np.random.default_rng(1).permutation(size // block)
        wins = windows(order, max(1, window // block))
        modes = [("sequential", mode_sequential, {}), ("qd1", mode_qd1, {}),
                 ("hint-next", mode_qd1, {"hint": "next"}), ("hint-window", mode_qd1, {"hint": "window"})]
        modes += [(f"threads-{n}", mode_threads, {"threads": int(n)}) for n in args.threads.split(",")]
        results: dict[str, list[float]] = {name: [] for name, _, _ in modes}
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(args.rounds):
                for name, fn, kw in modes:
                    drop_caches()
                    t0 = time.perf_counter()
                    got = fn(fd, size, wins=wins, block=block, **kw)
                    dt = time.perf_counter() - t0
                    assert got == size, (name, got, size)
                    results[name].append(size / dt / 1e9)
        finally:
            os.close(fd)
    seq = float(np.median(results["sequential"]))
    print(f"cold reads of {size >> 20} MiB in {block >> 20} MiB blocks, windows of {window >> 20} MiB, "
          f"{args.rounds} rounds (median), {os.cpu_count()} CPUs\n")
    print("| mode | GB/s (each round) | median | x sequential |")
    print("|---|---|---:|---:|")
    for name, got in results.items():
        med = float(np.median(got))
        print(f"| {name} | {' '.join(f'{g:.2f}' for g in got)} | {med:.2f} | {med / seq:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
