"""One contender of the peers race, run in its own process (``python peers_child.py CONFIG OUT``),
so that its memory is its own and no library state leaks into the next contender.

CONFIG is a JSON file: ``contender`` (a name of `peers_readers.CONTENDERS`, or of
`peers_mds.CONTENDERS` when run by the Streaming venv's Python), ``work`` (its directory),
``max_seconds``, ``min_samples``, ``watch`` (PIDs whose memory counts too: a FUSE daemon) and
whatever the contender reads.  The sequence:

1. prepare (conversion, indexing; a mount is made by the parent and timed there), then open the
   epoch-0 stream and take its first batch: the preparation time;
2. read the contender's files once (so the next pass is warm), then read epoch 1 until the time
   limit (or the epoch's end), and on past the limit until ``min_samples`` have been read: the
   warm rate, and the ids and labels whose mix is measured;
3. drop the page cache, then read epoch 2 until the time limit: the cold rate.

Memory is sampled every 0.1 s over the whole process tree (this process, its workers, the
``watch`` PIDs): proportional set size (PSS: shared pages split between the processes that map
them) and its anonymous part, from /proc/PID/smaps_rollup; peaks are kept per phase.  OUT gets a
JSON summary and OUT.npz the ids and labels of the warm pass.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]

SAMPLE_S = 0.1
WARMUP_S = 3.0


class TreeMemory:
    """Peak PSS (and its anonymous part) of a process tree, per phase, from a sampling thread."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.phase = "prep"
        self.peaks: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _children(pid: int) -> list[int]:
        out = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
        except OSError:
            pass
        return out

    def tree(self) -> set[int]:
        seen: set[int] = set()
        todo = list(self.roots)
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo += self._children(pid)
        return seen

    @staticmethod
    def _pss(pid: int) -> tuple[int, int]:
        pss = anon = 0
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss = int(line.split()[1]) * 1024
                    elif line.startswith("Pss_Anon:"):
                        anon = int(line.split()[1]) * 1024
        except OSError:
            pass
        return pss, anon

    def sample(self) -> None:
        pss = anon = 0
        for pid in self.tree():
            p, a = self._pss(pid)
            pss, anon = pss + p, anon + a
        peak = self.peaks.setdefault(self.phase, [0, 0])
        peak[0], peak[1] = max(peak[0], pss), max(peak[1], anon)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def __enter__(self) -> "TreeMemory":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_pass(contender, epoch: int, max_seconds: float, min_samples: int, keep: bool) -> dict:
    """One epoch's read, cut at ``max_seconds`` once ``min_samples`` are read."""
    ids: list[int] = []
    labels: list[int] = []
    n = 0
    complete = True
    t0 = time.perf_counter()
    first = None
    it = contender.batches(epoch)
    try:
        for bid, blab in it:
            if first is None:
                first = time.perf_counter() - t0
            n += len(bid)
            if keep:
                ids += bid
                labels += blab
            if n >= min_samples and time.perf_counter() - t0 > max_seconds:
                complete = False
                break
    finally:
        contender.close(it)
    secs = time.perf_counter() - t0
    complete = complete and n >= contender.n
    return {"samples": n, "seconds": secs, "first_s": first or 0.0, "complete": complete,
            "ids": ids, "labels": labels}


def first_batch(contender, epoch: int) -> float:
    """Seconds from opening the epoch's stream to its first batch (then the stream is closed)."""
    t0 = time.perf_counter()
    it = contender.batches(epoch)
    try:
        next(iter(it))
    finally:
        first = time.perf_counter() - t0
        contender.close(it)
    return first


def warm_files(paths: list[Path]) -> None:
    for p in paths:
        p = Path(p)
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.read(4 << 20):
                    pass


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def load(name: str):
    try:
        from bench.peers_readers import CONTENDERS
    except ImportError:  # the Streaming venv has none of the main venv's readers
        CONTENDERS = {}
    if name not in CONTENDERS:
        from bench.peers_mds import CONTENDERS
    return CONTENDERS[name]


def main(config_path: str, out_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    import numpy as np

    out: dict = {"contender": cfg["contender"]}
    with TreeMemory([os.getpid(), *cfg.get("watch", [])]) as mem:
        t0 = time.perf_counter()
        contender = load(cfg["contender"])(cfg)
        out["notes"] = contender.prepare() or ""
        out["prepare_s"] = time.perf_counter() - t0
        out["first_s"] = first_batch(contender, 0)
        out["prep_s"] = time.perf_counter() - t0
        out["config"] = contender.config
        out["info"] = getattr(contender, "info", {})
        # a short look at epoch 0, then the files read once: the next pass is warm
        read_pass(contender, 0, WARMUP_S, 0, False)
        warm_files(contender.files())
        mem.phase = "warm"
        warm = read_pass(contender, 1, cfg["max_seconds"], cfg["min_samples"], True)
        if cfg.get("cold", True):
            drop_caches()
            mem.phase = "cold"
            cold = read_pass(contender, 2, cfg["max_seconds"], 0, False)
            out["cold"] = {k: v for k, v in cold.items() if k not in ("ids", "labels")}
        contender.finish()
    out["warm"] = {k: v for k, v in warm.items() if k not in ("ids", "labels")}
    out["memory"] = mem.peaks
    np.savez(out_path + ".npz", ids=np.asarray(warm["ids"], np.int64), labels=np.asarray(warm["labels"], np.int64))
    Path(out_path).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
