"""Cold random block reads at queue depth: how fast each block size reads from this machine's
storage, by each way of keeping requests in flight, against a sequential read of the same file.

    sudo python tools/cold_io.py [--size 8GiB] [--dir DIR] [--blocks 16KiB,32KiB,...,4MiB]
                                 [--seconds 1.5] [--rounds 2] [--threads 1,2,4,8,16,32]
                                 [--uring 1,4,16,64] [--window 64MiB] [--keep] [--markdown]

Makes a file of ``--size`` random bytes under ``--dir`` (deleted afterwards unless ``--keep``;
an existing ``data.bin`` of that size there is reused), then for every block size and method
drops the page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``, hence root) and reads random
block-aligned blocks (no block twice in a measurement) for ``--seconds``, buffered (through the
page cache, as the views read).  Methods:

  seq             1 MiB preads front to back from a random offset (the kernel's readahead), taken
                  before every block size; their median is the denominator of every fraction
  seq-file        the whole file front to back once per round (the same, over every byte)
  threads-N       N threads, each preading whole blocks one at a time (queue depth N)
  hint-window     the views' way: per window of ``--window`` bytes of blocks (sorted by offset),
                  posix_fadvise(WILLNEED) on each block, then 1 MiB preads in ascending order
                  from one thread (depth = whatever the kernel's readahead keeps in flight)
  hint-window+next  the same, with the next window's blocks hinted too before reading a window
                  (what the daemon does: hint k and k+1, load k)
  uring-N         io_uring with N reads of whole blocks in flight (buffered), if the ``liburing``
                  binding imports and io_uring works here; skipped otherwise

Prints one table per round and a summary of medians (MB/s and fraction of sequential) with
``--markdown`` rows for the docs.  Results on this project's VM are quoted in `shufflefs.advise.probe`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shufflefs.config import parse_size

CHUNK = 1 << 20
KiB, MiB = 1 << 10, 1 << 20
DEFAULT_BLOCKS = "16KiB,32KiB,64KiB,128KiB,256KiB,512KiB,1MiB,2MiB,4MiB"

try:  # optional: pip install liburing (Linux 6.14+)
    import liburing as _uring
except ImportError:  # pragma: no cover - depends on the machine
    _uring = None


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_file(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size == size:
        return
    chunk = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8)
    with open(path, "wb") as f:
        for i, off in enumerate(range(0, size, len(chunk))):
            chunk[0] = i & 0xFF  # not one repeated 64 MiB pattern, in case anything below dedups
            f.write(chunk[: min(len(chunk), size - off)].tobytes())
        f.flush()
        os.fsync(f.fileno())


def read_full(fd: int, start: int, size: int, buf: memoryview, chunk: int) -> int:
    got = 0
    while got < size:
        n = os.preadv(fd, [buf[: min(chunk, size - got)]], start + got)
        if n <= 0:
            break
        got += n
    return got


class Blocks:
    """Random distinct block offsets of one measurement, handed out in order (thread-safe)."""

    def __init__(self, size: int, block: int, rnd: np.random.Generator) -> None:
        self.offsets = rnd.permutation(size // block).astype(np.int64) * block
        self.i = 0
        self.lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        with self.lock:
            got = self.offsets[self.i: self.i + n]
            self.i += len(got)
        return got


# --------------------------------------------------------------------------- methods
# each returns (bytes read, seconds) for about ``seconds`` of reading of ``block``-byte blocks


def m_seq(fd: int, size: int, block: int, seconds: float, rnd: np.random.Generator, **_) -> tuple[int, float]:
    buf = memoryview(bytearray(CHUNK))
    off = int(rnd.integers(size // CHUNK)) * CHUNK
    total = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        n = read_full(fd, off, CHUNK, buf, CHUNK)
        total += n
        off = (off + n) % size
    return total, time.perf_counter() - t0


def m_seq_file(fd: int, size: int, **_) -> tuple[int, float]:
    buf = memoryview(bytearray(CHUNK))
    t0 = time.perf_counter()
    total = sum(read_full(fd, off, CHUNK, buf, CHUNK) for off in range(0, size, CHUNK))
    return total, time.perf_counter() - t0


def m_threads(fd: int, size: int, block: int, seconds: float, rnd: np.random.Generator, depth: int,
              **_) -> tuple[int, float]:
    blocks = Blocks(size, block, rnd)
    counts = [0] * depth
    t0 = time.perf_counter()
    deadline = t0 + seconds

    def reader(i: int) -> None:
        buf = memoryview(bytearray(block))
        while time.perf_counter() < deadline:
            got = blocks.take(1)
            if not len(got):
                return
            counts[i] += read_full(fd, int(got[0]), block, buf, block)

    workers = [threading.Thread(target=reader, args=(i,)) for i in range(depth)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts), time.perf_counter() - t0


def m_hint(fd: int, size: int, block: int, seconds: float, rnd: np.random.Generator, window: int,
           ahead: bool = False, **_) -> tuple[int, float]:
    """Windows of blocks read as `shufflefs.windows.view.View` loads them on a cold source: WILLNEED on
    each block of the window (and of the next one if ``ahead``), then ascending 1 MiB preads."""
    blocks = Blocks(size, block, rnd)
    per = max(1, window // block)
    buf = memoryview(bytearray(CHUNK))
    hint = os.POSIX_FADV_WILLNEED
    total = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    current = np.sort(blocks.take(per))
    windows = 0
    while len(current) and (windows < 2 or time.perf_counter() < deadline):
        following = np.sort(blocks.take(per))
        for off in current.tolist():
            os.posix_fadvise(fd, off, block, hint)
        if ahead:
            for off in following.tolist():
                os.posix_fadvise(fd, off, block, hint)
        for off in current.tolist():
            total += read_full(fd, off, block, buf, CHUNK)
        windows += 1
        current = following
    return total, time.perf_counter() - t0


def uring_available() -> str | None:
    """None if io_uring reads work here through the binding, else why not."""
    if _uring is None:
        return "the liburing binding is not installed"
    try:
        ring = _uring.Ring()
        _uring.io_uring_queue_init(4, ring)
        _uring.io_uring_queue_exit(ring)
    except Exception as e:  # noqa: BLE001 - any failure means: not here
        return f"io_uring_queue_init failed: {e}"
    return None


def m_uring(fd: int, size: int, block: int, seconds: float, rnd: np.random.Generator, depth: int,
            **_) -> tuple[int, float]:
    """``depth`` whole-block reads in flight; a short read (buffered reads return what is ready)
    is continued by a read of the rest (the binding takes whole bytearrays: a fresh one)."""
    U = _uring
    blocks = Blocks(size, block, rnd)
    ring, cqe = U.Ring(), U.Cqe()
    U.io_uring_queue_init(max(depth, 1) * 2, ring)
    bufs: list[bytearray] = [bytearray(block) for _ in range(depth)]
    todo = [(0, 0)] * depth  # per slot: (next offset, bytes still to read)
    total = short = inflight = 0

    def prep(slot: int, offset: int, want: int) -> None:
        if want != len(bufs[slot]):
            bufs[slot] = bytearray(want)
        sqe = U.io_uring_get_sqe(ring)
        U.io_uring_prep_read(sqe, fd, bufs[slot], offset)
        U.io_uring_sqe_set_data64(sqe, slot)
        todo[slot] = (offset, want)

    def submit(slot: int) -> bool:
        got = blocks.take(1)
        if len(got):
            prep(slot, int(got[0]), block)
        return bool(len(got))

    try:
        t0 = time.perf_counter()
        deadline = t0 + seconds
        for slot in range(depth):
            inflight += submit(slot)
        U.io_uring_submit(ring)
        while inflight:
            U.io_uring_wait_cqe(ring, cqe)
            ready = U.io_uring_cq_ready(ring)
            live = time.perf_counter() < deadline
            for j in range(ready):
                c = cqe[j]
                res, slot = c.res, c.user_data
                if res < 0:
                    raise OSError(-res, os.strerror(-res))
                total += res
                offset, want = todo[slot]
                if 0 < res < want:
                    short += 1
                    prep(slot, offset + res, want - res)
                    continue
                inflight -= 1
                if live:
                    inflight += submit(slot)
            U.io_uring_cq_advance(ring, ready)
            U.io_uring_submit(ring)
        dt = time.perf_counter() - t0
    finally:
        U.io_uring_queue_exit(ring)
    if short:
        print(f"  (uring-{depth} {block >> 10} KiB: {short} short reads continued)", file=sys.stderr)
    return total, dt


# --------------------------------------------------------------------------- driver


def methods(threads: list[int], uring: list[int]) -> list[tuple[str, object, dict]]:
    out: list[tuple[str, object, dict]] = [(f"threads-{n}", m_threads, {"depth": n}) for n in threads]
    out += [("hint-window", m_hint, {}), ("hint-window+next", m_hint, {"ahead": True})]
    out += [(f"uring-{n}", m_uring, {"depth": n}) for n in uring]
    return out


def run_round(fd: int, size: int, blocks: list[int], todo: list[tuple[str, object, dict]], seconds: float,
              window: int, rnd: np.random.Generator, log) -> dict[tuple[str, int], float]:
    """MB/s per (method, block size); ("seq", 0) and ("seq-file", 0) for the baselines."""
    got: dict[tuple[str, int], float] = {}
    drop_caches()
    n, dt = m_seq_file(fd, size)
    got[("seq-file", 0)] = n / dt / 1e6
    log(f"seq-file {got[('seq-file', 0)]:.0f} MB/s")
    seqs = []
    for block in blocks:
        drop_caches()
        n, dt = m_seq(fd, size, block, seconds, rnd)
        seqs.append(n / dt / 1e6)
        for name, fn, kw in todo:
            drop_caches()
            n, dt = fn(fd, size, block, seconds, rnd, window=window, **kw)
            got[(name, block)] = n / dt / 1e6
            log(f"{block >> 10:>5} KiB {name:<17} {got[(name, block)]:8.1f} MB/s")
    got[("seq", 0)] = statistics.median(seqs)
    log(f"seq (median of {len(seqs)}: {' '.join(f'{s:.0f}' for s in seqs)}) {got[('seq', 0)]:.0f} MB/s")
    return got


def device_facts(path: Path) -> list[str]:
    st = os.stat(path)
    facts = [f"file on st_dev {os.major(st.st_dev)}:{os.minor(st.st_dev)}"]
    sysdev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    for name in ("queue/read_ahead_kb", "queue/nr_requests", "queue/max_sectors_kb", "queue/scheduler",
                 "queue/rotational"):
        try:
            facts.append(f"{name.split('/')[-1]}={(sysdev / name).read_text().strip()}")
        except OSError:
            pass
    return facts


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= MiB else f"{n >> 10} KiB"


def summary(rounds: list[dict[tuple[str, int], float]], blocks: list[int], names: list[str]) -> list[str]:
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    seq = med[("seq", 0)]
    lines = [f"sequential: {seq:.0f} MB/s (1 MiB preads, median over block sizes and rounds); whole file "
             f"{med[('seq-file', 0)]:.0f} MB/s; rounds: "
             + ", ".join(f"{r[('seq', 0)]:.0f}/{r[('seq-file', 0)]:.0f}" for r in rounds), "",
             "MB/s (fraction of sequential), median of rounds", "",
             "| block | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for block in blocks:
        cells = [f"{med[(n, block)]:.0f} ({med[(n, block)] / seq:.2f})" for n in names]
        lines.append(f"| {_size(block)} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="8GiB")
    p.add_argument("--dir", default="/work/tmp-coldio")
    p.add_argument("--blocks", default=DEFAULT_BLOCKS)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", default="1,2,4,8,16,32")
    p.add_argument("--uring", default="1,4,16,64", help="depths; empty to skip")
    p.add_argument("--window", default="64MiB")
    p.add_argument("--keep", action="store_true", help="keep the data file")
    args = p.parse_args()
    size, window = parse_size(args.size), parse_size(args.window)
    blocks = sorted(parse_size(b) for b in args.blocks.split(","))
    size -= size % max(blocks)
    threads = [int(n) for n in args.threads.split(",") if n]
    uring = [int(n) for n in args.uring.split(",") if n]
    why = uring_available() if uring else None
    if why:
        print(f"io_uring skipped: {why}")
        uring = []
    todo = methods(threads, uring)
    names = [name for name, _, _ in todo]
    path = Path(args.dir) / "data.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    make_file(path, size)
    print(f"{size >> 30} GiB file, {os.cpu_count()} CPUs, {args.seconds} s per measurement, windows of "
          f"{_size(window)}; " + ", ".join(device_facts(path)), flush=True)
    rnd = np.random.default_rng(1)
    fd = os.open(path, os.O_RDONLY)
    try:
        rounds = []
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            rounds.append(run_round(fd, size, blocks, todo, args.seconds, window, rnd,
                                    lambda s: print("  " + s, flush=True)))
    finally:
        os.close(fd)
        if not args.keep:
            path.unlink()
    print("\n".join(["", *summary(rounds, blocks, names)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
