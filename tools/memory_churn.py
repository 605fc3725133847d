#!/usr/bin/env python3
"""Daemon peak memory under many readers and fast epoch changes, as a ratio to the documented
bound (16 bytes per record + 3 windows + 100 MiB; a window build's working memory counts as the
spare window, or beyond it for records so small that it takes more than a window).

    python tools/memory_churn.py [--records 1500000] [--readers 32] [--flip-ms 5] [--seconds 8]
                                 [--stagger-ms 0] [--strategies corgipile,full,...] [--verbose]
                                 [--world 2] [--rank 0] [--exchange 0.2] [--stage-dir DIR] [--samples-over]

Writes a JSON lines file, builds its offset table (``shufflefs index``), and for each strategy
mounts it (default buffer 64 MiB), runs the readers (each reads the whole view again and again,
checking it is one permutation of the records) while another thread sets a new epoch every few
milliseconds, and samples the daemon's own memory (RssAnon + RssShmem, `bench.proc.own_rss`: the
bound's measure; VmHWM, printed beside it, also counts the source pages record-level views map).  One mount per strategy, all in one run.  With
``--stagger-ms``, reader i starts i times that later, so each opens its own epoch (32 epochs read
at once: every plan and window distinct).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO))

from bench.lines import numbered_lines, permutation_check  # noqa: E402
from bench.proc import FuseDaemon, own_rss, peak_rss  # noqa: E402
from shufflefs.config import STATS_XATTR  # noqa: E402
from shufflefs.formats import make_format, scan_file  # noqa: E402
from shufflefs.strategies import ShuffleSpec, make_plan  # noqa: E402
from shufflefs.windows.view import window_work  # noqa: E402

MiB = 1 << 20
BUFFER = 64 * MiB


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount in the finally blocks on a kill
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_500_000)
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--flip-ms", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="start reader i after i times this (each then reads its own epoch)")
    ap.add_argument("--sample-ms", type=float, default=10.0, help="--verbose: how often RSS is sampled")
    ap.add_argument("--verbose", action="store_true", help="also show the window cache at the highest RSS")
    ap.add_argument("--strategies", default="none,once,full,lirs-page,block,corgipile,window,pls")
    ap.add_argument("--world", type=int, default=2, help="pls: the world size (--world-size)")
    ap.add_argument("--rank", type=int, default=0, help="pls: the mount's rank")
    ap.add_argument("--exchange", type=float, default=0.2, help="pls: the fraction exchanged per epoch")
    ap.add_argument("--stage-dir", help="pls: stage partitions under this directory (--stage-dir)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="churn-") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        data = numbered_lines(a.records, 7, 50)
        (work / "src" / "a.jsonl").write_bytes(data)
        check = permutation_check(a.records, 7, 50)
        assert check(data)
        # the offset table first, as `shufflefs index` would: every mount then starts from the cache
        # (a first open that scans also holds the table's copies as it comes from the scanning process)
        import subprocess

        subprocess.run([sys.executable, "-m", "shufflefs", "index", str(work / "src"), "--cache-dir", str(work / "cache")],
                       check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        window = min(BUFFER, len(data))
        index = scan_file(work / "src" / "a.jsonl", make_format("lines"))
        for run, strategy in enumerate(a.strategies.split(",")):
            mnt = work / f"mnt-{run}-{strategy}"
            mnt.mkdir()
            pls = strategy == "pls"
            spec = ShuffleSpec(strategy=strategy, buffer=BUFFER, exchange=a.exchange if pls else 0.0)
            rank, world = (a.rank, a.world) if pls else (0, 1)
            # the documented bound: 16 bytes per record + 3 windows (and what a window build works with
            # beyond one window, for tiny records) + 100 MiB
            work_bytes = window_work(make_plan(index, spec, 0, rank, world))
            bound = 16 * a.records + 3 * window + max(0, work_bytes - window) + 100 * MiB
            cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(work / "src"), str(mnt), "--strategy",
                   strategy, "--buffer", str(BUFFER), "--cache-dir", str(work / "cache")]
            if pls:
                cmd += ["--world-size", str(a.world), "--rank", str(a.rank), "--exchange", str(a.exchange)]
                if a.stage_dir:
                    cmd += ["--stage-dir", a.stage_dir]
            env = dict(os.environ, PYTHONPATH=str(REPO))
            with FuseDaemon(cmd, mnt, work / f"{strategy}.log", env=env) as d:
                stop = time.monotonic() + a.seconds
                bad, reads = [], [0]

                def flip() -> None:
                    e = 0
                    while time.monotonic() < stop:
                        e += 1
                        os.setxattr(mnt, "user.shufflefs.epoch", str(e).encode())
                        time.sleep(a.flip_ms / 1000)

                def reader(i: int) -> None:
                    time.sleep(i * a.stagger_ms / 1000)  # each reader opens at its own epoch
                    while time.monotonic() < stop:
                        with open(mnt / "a.jsonl", "rb") as f:
                            got = f.read()
                        if strategy != "pls" and not check(got):
                            bad.append(1)
                        reads[0] += 1

                top: list = [0, None]
                samples = [0, 0]  # taken, over the bound

                def sample() -> None:
                    """The daemon's RSS and its own count of window bytes at the highest RSS seen."""
                    while not done.is_set():
                        rss = own_rss(d.pid)
                        samples[0] += 1
                        samples[1] += rss > bound
                        if rss > top[0]:
                            try:
                                mem = json.loads(os.getxattr(mnt, STATS_XATTR))["memory"]
                                with open(f"/proc/{d.pid}/smaps_rollup") as f:
                                    mem["rollup"] = {k: v.split()[0] for k, v in (ln.split(":", 1) for ln in f if ":" in ln)
                                                     if k in ("Rss", "Anonymous", "Rss_File", "Rss_Anon", "Private_Clean")}
                                with open(f"/proc/{d.pid}/status") as f:
                                    mem["threads"] = [ln.split()[1] for ln in f if ln.startswith("Threads")][0]
                            except OSError:
                                mem = None
                            top[:] = [rss, mem, round(time.monotonic() - t0, 2)]
                        time.sleep(a.sample_ms / 1000)

                threads = [threading.Thread(target=flip), threading.Thread(target=sample)]
                threads += [threading.Thread(target=reader, args=(i,)) for i in range(a.readers)]
                t0 = time.monotonic()
                done = threading.Event()
                for t in threads:
                    t.start()
                for t in threads[2:] + threads[:1]:
                    t.join()
                done.set()
                threads[1].join()
                took = time.monotonic() - t0
                hwm = peak_rss(d.pid)
                peak = max(top[0], own_rss(d.pid))
            rows.append((strategy, peak, reads[0], len(bad)))
            print(f"{strategy:10} own {peak / MiB:7.0f} MiB (VmHWM {hwm / MiB:.0f})  bound {bound / MiB:5.0f} MiB  "
                  f"ratio {peak / bound:5.2f} ({samples[1]} of {samples[0]} samples over)  "
                  f"whole reads {reads[0]} in {took:.1f} s ({reads[0] * len(data) / took / 1e9:.2f} GB/s)  "
                  f"wrong {len(bad)}", flush=True)
            if a.verbose and top[1]:
                m = top[1]
                print(f"{'':10} at the highest own memory sampled ({top[0] / MiB:.0f} MiB at {top[2]} s): windows "
                      f"{m['window_bytes'] / MiB:.0f} MiB, free buffers {m['pooled_bytes'] / MiB:.0f} MiB, "
                      f"limit {m['limit_bytes'] / MiB:.0f} MiB; {m}", flush=True)
    print(f"{a.records} records, {a.readers} readers, an epoch every {a.flip_ms:g} ms for {a.seconds:g} s"
          + (f", reader i starting after i x {a.stagger_ms:g} ms (each at its own epoch)" if a.stagger_ms else ""))
    return 1 if any(r[3] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
