#!/usr/bin/env python3
"""Which S3 client serves shufflefs windows best: obstore vs boto3, ranged GETs of whole blocks.

    python tools/s3_clients.py [--server nginx|moto] [--size 256MiB] [--block 8MiB] [--inflight 1,4,16,64]
                               [--endpoint-url URL]

``--server moto`` starts moto's S3 server (``moto[server]``) and uploads one object of ``--size``:
a Python server that copies the whole object for every ranged GET, so it, not the client, sets
the pace.  ``--server nginx`` (the default) serves the same object as a static file from nginx
(Debian's package), which answers path-style S3 GETs and HEADs of one object, ranges and
``If-Match`` included, at C speed, so the clients are what differ.  ``--endpoint-url`` uses a
server of your own (bucket ``--bucket``, credentials from the environment).  For each client and number of requests in flight it reads every block of
the object once, in a random order (as a `corgipile` window does), each GET carrying ``If-Match``
with the object's ETag, and reports GB/s, the client process's CPU seconds per GB (what the
daemon pays) and the server's, plus the time to the first byte of one small range.  Ratios are
against boto3 at the same depth, in the same run.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from shufflefs.config import format_size, parse_size  # noqa: E402

Fetch = Callable[[int, int], int]


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def boto3_fetch(endpoint: str, bucket: str, key: str, etag: str, depth: int) -> Fetch:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=max(depth, 10),
                                                                     s3={"addressing_style": "path"}))

    def fetch(start: int, end: int) -> int:
        r = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=etag)
        return len(r["Body"].read())
    return fetch


def obstore_fetch(endpoint: str, bucket: str, key: str, etag: str, depth: int) -> Fetch:
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, client_options={"allow_http": True,
                                                               "pool_max_idle_per_host": str(max(depth, 10))})

    def fetch(start: int, end: int) -> int:
        r = obstore.get(store, key, options={"range": (start, end), "if_match": etag})
        return len(memoryview(r.bytes()))
    return fetch


CLIENTS = {"boto3": boto3_fetch, "obstore": obstore_fetch}


NGINX_CONF = """daemon off; user root; worker_processes 2; pid {tmp}/nginx.pid; error_log {tmp}/nginx.err;
events {{ worker_connections 1024; }}
http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  server {{ listen 127.0.0.1:{port}; root {tmp}/root; }} }}
"""


def start_nginx(tmp: Path, bucket: str, key: str, body: bytes) -> tuple[subprocess.Popen, str]:
    from objstore import free_port

    (tmp / "root" / bucket).mkdir(parents=True)
    (tmp / "root" / bucket / key).write_bytes(body)
    port = free_port()
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, port=port))
    p = subprocess.Popen(["nginx", "-c", str(tmp / "nginx.conf"), "-p", str(tmp)], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, f"http://127.0.0.1:{port}"
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise SystemExit("nginx did not start: " + (tmp / "nginx.err").read_text())
            time.sleep(0.05)


def run(make: Callable[..., Fetch], endpoint: str, bucket: str, key: str, etag: str, size: int, block: int,
        depth: int, server_pid: int | None) -> dict[str, float]:
    fetch = make(endpoint, bucket, key, etag, depth)
    t = time.perf_counter()
    fetch(0, 4096)
    ttfb = time.perf_counter() - t
    ranges = [(s, min(s + block, size)) for s in range(0, size, block)]
    random.Random(0).shuffle(ranges)
    cpu0, srv0, t0 = time.process_time(), cpu_of(server_pid) if server_pid else 0.0, time.perf_counter()
    with ThreadPoolExecutor(depth) as pool:
        got = sum(pool.map(lambda r: fetch(*r), ranges))
    wall = time.perf_counter() - t0
    if got != size:
        raise SystemExit(f"read {got} bytes of {size}")
    gb = size / 1e9
    return {"gbps": gb / wall, "cpu": (time.process_time() - cpu0) / gb, "ttfb": ttfb * 1e3,
            "server": ((cpu_of(server_pid) - srv0) / gb) if server_pid else float("nan")}


def _num(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"  # NaN: not measured (nginx's workers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--block", default="8MiB")
    ap.add_argument("--inflight", default="1,4,16,64")
    ap.add_argument("--server", choices=("nginx", "moto"), default="nginx")
    ap.add_argument("--endpoint-url")
    ap.add_argument("--bucket", default="shufflefs-bench")
    ap.add_argument("--repeat", type=int, default=2, help="rounds per client and depth (the best is shown)")
    args = ap.parse_args()
    size, block = parse_size(args.size), parse_size(args.block)
    depths = [int(x) for x in args.inflight.split(",")]
    server = nginx = None
    key = "blob.bin"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            from objstore import CREDENTIALS, S3Server

            os.environ.update({k: os.environ.get(k, v) for k, v in CREDENTIALS.items()})
            if args.endpoint_url is not None:
                endpoint, pid = args.endpoint_url, None
            elif args.server == "nginx":
                nginx, endpoint = start_nginx(Path(tmp), args.bucket, key, os.urandom(size))
                pid = None  # two worker processes; their CPU is not counted
            else:
                server = S3Server(Path(tmp)).start()
                endpoint, pid = f"http://127.0.0.1:{server.upstream}", server.proc.pid
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint)
            if nginx is None:
                if server is not None:
                    client.create_bucket(Bucket=args.bucket)
                client.put_object(Bucket=args.bucket, Key=key, Body=os.urandom(size))
            etag = client.head_object(Bucket=args.bucket, Key=key)["ETag"]
            results: dict[tuple[str, int], dict[str, float]] = {}
            for depth in depths:
                for _ in range(args.repeat):
                    for name in CLIENTS:  # alternating, so drift hits both alike
                        r = run(CLIENTS[name], endpoint, args.bucket, key, etag, size, block, depth, pid)
                        best = results.get((name, depth))
                        if best is None or r["gbps"] > best["gbps"]:
                            results[(name, depth)] = r
                        print(f"{name:8} depth {depth:3}: {r['gbps']:.3f} GB/s", file=sys.stderr)
        finally:
            if server is not None:
                server.stop()
            if nginx is not None:
                nginx.terminate()
                nginx.wait(10)
    print(f"{format_size(size)} in {block >> 20} MiB ranged GETs with If-Match, random order; best of "
          f"{args.repeat}; server: {args.endpoint_url or args.server}\n")
    print("| client | in flight | GB/s | x boto3 | client CPU s/GB | server CPU s/GB | first byte ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for depth in depths:
        for name in CLIENTS:
            r, base = results[(name, depth)], results[("boto3", depth)]
            print(f"| {name} | {depth} | {r['gbps']:.3f} | {r['gbps'] / base['gbps']:.2f} | {r['cpu']:.2f} | "
                  f"{_num(r['server'])} | {r['ttfb']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
