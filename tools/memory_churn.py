#!/usr/bin/env python3
"""Daemon peak memory under many readers and fast epoch changes, as a ratio to the documented
bound (16 bytes per record + 3 windows + 100 MiB).

    python tools/memory_churn.py [--records 1500000] [--readers 32] [--flip-ms 5] [--seconds 8]
                                 [--strategies corgipile,full,...]

Writes a JSON lines file, builds its offset table (``shufflefs index``), and for each strategy mounts it (default buffer 64 MiB), runs the
readers (each reads the whole view again and again, checking it is one permutation of the
records) while another thread sets a new epoch every few milliseconds, then reads the daemon's
VmHWM.  One mount per strategy, all in one run.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from bench.proc import FuseDaemon, peak_rss  # noqa: E402

MiB = 1 << 20
BUFFER = 64 * MiB


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount in the finally blocks on a kill
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_500_000)
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--flip-ms", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--strategies", default="none,once,full,lirs-page,block,corgipile,window,pls")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="churn-") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        data = b"".join(b'{"i": %07d, "p": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(a.records))
        (work / "src" / "a.jsonl").write_bytes(data)
        expect = collections.Counter(data.splitlines())
        # the offset table first, as `shufflefs index` would: every mount then starts from the cache
        # (a first open that scans also holds the table's copies as it comes from the scanning process)
        import subprocess

        subprocess.run([sys.executable, "-m", "shufflefs", "index", str(work / "src"), "--cache-dir", str(work / "cache")],
                       check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        window = min(BUFFER, len(data))
        bound = 16 * a.records + 3 * window + 100 * MiB
        for strategy in a.strategies.split(","):
            mnt = work / f"mnt-{strategy}"
            mnt.mkdir()
            cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(work / "src"), str(mnt), "--strategy",
                   strategy, "--buffer", str(BUFFER), "--cache-dir", str(work / "cache")]
            if strategy == "pls":
                cmd += ["--world-size", "2", "--exchange", "0.2"]
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

                def reader() -> None:
                    while time.monotonic() < stop:
                        with open(mnt / "a.jsonl", "rb") as f:
                            got = collections.Counter(f.read().splitlines())
                        if strategy != "pls" and got != expect:
                            bad.append(1)
                        reads[0] += 1

                threads = [threading.Thread(target=flip)] + [threading.Thread(target=reader) for _ in range(a.readers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                peak = peak_rss(d.pid)
            rows.append((strategy, peak, reads[0], len(bad)))
            print(f"{strategy:10} VmHWM {peak / MiB:7.0f} MiB  bound {bound / MiB:5.0f} MiB  ratio {peak / bound:5.2f}  "
                  f"whole reads {reads[0]}  wrong {len(bad)}", flush=True)
    print(f"{a.records} records, {a.readers} readers, an epoch every {a.flip_ms:g} ms for {a.seconds:g} s")
    return 1 if any(r[3] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
