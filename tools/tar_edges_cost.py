#!/usr/bin/env python3
"""What checking tar samples against their neighbours costs on object storage: requests and
bytes a mount fetches to read a WebDataset shard's view, per epoch.

    python tools/tar_edges_cost.py [--samples 600] [--sample-kb 100] [--epochs 3] [--mount-args ""]

A tar of ``--samples`` samples of three members (a JPEG-sized ``.jpg`` of ``--sample-kb`` KB
+-20%, a ``.cls``, a ``.json``) is put in a local moto server (``pip install moto[server] boto3
obstore``), a mount of it (defaults: the ``stratified`` order, automatic block size) reads the
whole view every epoch with 1 MiB reads, and the mount's own counters say what it fetched
(``user.shufflefs.stats``: ``source_requests``, ``fetched_bytes``) beside the record bytes.  Run it
from two checkouts (this file's repository is the one mounted) to compare two versions.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from bench import proc  # noqa: E402

BUCKET = "data"
ENV = {"AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", "AWS_DEFAULT_REGION": "us-east-1"}
MiB = 1 << 20


def shard(samples: int, kb: float) -> bytes:
    rng = np.random.default_rng(0)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(samples):
            size = int(kb * 1000 * rng.uniform(0.8, 1.2))
            for ext, data in (("jpg", rng.integers(0, 256, size, dtype=np.uint8).tobytes()),
                              ("cls", b"%d" % (i % 10)), ("json", json.dumps({"i": i, "label": i % 10}).encode())):
                info = tarfile.TarInfo(f"{i:07d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--sample-kb", type=float, default=100.0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--mount-args", default="", help="more mount options")
    args = ap.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update(ENV)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    work = Path(tempfile.mkdtemp(prefix="shufflefs-tar-edges-"))
    try:
        body = shard(args.samples, args.sample_kb)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="ds/shard-000000.tar", Body=body)
        mnt = work / "mnt"
        mnt.mkdir()
        cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", f"s3://{BUCKET}/ds", str(mnt), "--endpoint-url",
               endpoint, "--cache-dir", str(work / "cache"), *args.mount_args.split()]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        print(f"{REPO}: {args.samples} samples, {len(body) / 1e6:.1f} MB; mount options "
              f"`{args.mount_args or 'defaults'}`")
        print("| epoch | record MB | fetched MB | fetched / records | GETs | records / GET |")
        print("|---:|---:|---:|---:|---:|---:|")
        with proc.FuseDaemon(cmd, mnt, work / "daemon.log", env=env) as d:
            view = mnt / "shard-000000.tar"
            for epoch in range(args.epochs):
                os.setxattr(mnt, "user.shufflefs.epoch", str(epoch).encode())
                with open(view, "rb", buffering=0) as f:
                    while f.read(MiB):
                        pass
                stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
                e = stats["read_bytes"][str(epoch)]
                src, got, gets = e["source_bytes"], e["fetched_bytes"], e["source_requests"]
                print(f"| {epoch} | {src / 1e6:.2f} | {got / 1e6:.2f} | {got / src:.4f} | {gets} | "
                      f"{args.samples / max(gets, 1):.1f} |")
            info = os.getxattr(view, "user.shufflefs.info").decode()
            print("view:", info[:400])
            del d
    finally:
        server.stop()


if __name__ == "__main__":
    main()
