"""Object storage: views of a bucket prefix on a local S3 server (moto's server mode).

The JSON lines dataset's first ``--s3-size`` bytes are cut at line ends into shards of one pool
and uploaded; each mount first opens every shard once (building the indexes: a download of each,
not measured), then a fresh epoch is measured (shards of 4 MiB: moto copies a whole object for
every ranged GET):

* ``none``, ``corgipile`` and ``full`` read front to back with 1 MiB reads, cut after
  ``--max-seconds`` (counts then scaled to the epoch): GB/s, the bytes and GET requests the epoch
  cost (from the mount's ``stat``), and the time from an epoch change to the first byte;
* ``corgipile`` with 1, 4, 16 and 64 requests in flight (``--requests``).

The server is a Python process on the same two vCPUs, so absolute rates say more about it than
about S3; bytes and requests per epoch are what carry over to a real bucket.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import proc, reads

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the test suite's S3 server
from objstore import CREDENTIALS  # noqa: E402

BUCKET = "shufflefs-bench"
SHARD = 4 << 20
"""Bytes per shard: moto copies a whole object for every ranged GET, so small objects keep the
server's cost per request near what the request returns."""
STRATEGIES = ("none", "corgipile", "full")
DEPTHS = (1, 4, 16, 64)
MiB = 1 << 20
EPOCH_ATTR = "user.shufflefs.epoch"


def missing() -> str | None:
    """Why the section cannot run here, or None."""
    need = [m for m in ("obstore", "moto", "boto3") if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(need)} (pip install 'shufflefs[s3]' 'moto[server]')" if need else None


def shards_of(path: Path, size: int, n: int) -> list[bytes]:
    """The first ``size`` bytes of a line file, cut at line ends into ``n`` shards."""
    with open(path, "rb") as f:
        data = f.read(size)
    data = data[: data.rindex(b"\n") + 1]
    out, start = [], 0
    for i in range(1, n + 1):
        end = len(data) if i == n else data.index(b"\n", i * len(data) // n) + 1
        out.append(data[start:end])
        start = end
    return out


class ObjectBench:
    """The object-storage section of one benchmark run (``bench``: the run's `Bench`)."""

    def __init__(self, bench: Any, size: int) -> None:
        self.b = bench
        self.size = size
        self.lines: list[str] = []
        self.epoch = 20_000
        # 32 blocks (8 MiB, the default for object storage, at 256 MiB) and a buffer of 1/16 of
        # the data, so that a record-level window spans the whole dataset sparsely
        self.block = min(max(size // 32, MiB), 8 * MiB)
        self.buffer = max(size // 16, 2 * self.block)

    def run(self) -> None:
        why = missing()
        lines_ds = next((d for d in self.b.datasets if d.name == "lines"), None)
        if why is None and lines_ds is None:
            why = "needs the lines dataset"
        if why is not None:
            self.lines = [f"Not run: {why}."]
            return
        from objstore import S3Server

        server = S3Server(self.b.work).start()
        try:
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            shards = shards_of(lines_ds.path, self.size, max(self.size // SHARD, 1))
            for i, body in enumerate(shards):
                client.put_object(Bucket=BUCKET, Key=f"ds/part-{i:05d}.jsonl", Body=body)
            self.total = sum(len(s) for s in shards)
            self.records = sum(s.count(b"\n") for s in shards)
            self.names = [f"part-{i:05d}.jsonl" for i in range(len(shards))]
            rows = {s: self._measure(server, s, 16) for s in STRATEGIES}
            depth_rows = {d: (rows["corgipile"] if d == 16 else self._measure(server, "corgipile", d)) for d in DEPTHS}
        finally:
            server.stop()
        self._write(rows, depth_rows)

    def _measure(self, server: Any, strategy: str, depth: int) -> dict[str, float]:
        b = self.b
        mnt = b.work / f"mnt-s3-{strategy}-{depth}"
        mnt.mkdir(exist_ok=True)
        cmd = b.shufflefs_cmd(f"s3://{BUCKET}/ds", mnt, strategy, "--block-size", str(self.block),
                              "--buffer", str(self.buffer), "--endpoint-url",
                              f"http://127.0.0.1:{server.upstream}", "--requests", str(depth),  # not the fault proxy
                              "--log-file", str(b.logs / f"s3-{strategy}-{depth}.log"))
        with proc.FuseDaemon(cmd, mnt, b.logs / f"s3-{strategy}-{depth}.out", env=dict(b.env, **CREDENTIALS)):
            for name in self.names:  # an open indexes a shard (a full download, once), not measured
                os.close(os.open(mnt / name, os.O_RDONLY))
            self.epoch += 1
            os.setxattr(mnt, EPOCH_ATTR, str(self.epoch).encode())
            t0 = time.perf_counter()
            with open(mnt / self.names[0], "rb", buffering=0) as f:
                f.read(1)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            got = self._pass(mnt, t0 + b.args.max_seconds)
            seconds = time.perf_counter() - t0
            stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        counts = stats["read_bytes"].get(str(self.epoch), {})
        # a pass cut short stands for the whole epoch (marked ~): the windows loaded so far (read
        # or ahead) cost this much per record byte
        loaded = counts.get("source_bytes", 0) or 1
        scale = self.total / loaded if got < self.total else 1.0
        r = {"gbps": got / seconds / 1e9, "bytes": counts.get("fetched_bytes", 0) * scale,
             "requests": counts.get("source_requests", 0) * scale, "first_ms": first * 1e3, "cut": got < self.total}
        b.say(f"s3     {strategy:10} {depth:3} in flight {r['gbps']:7.3f} GB/s {r['requests']:8.0f} requests/epoch")
        return r

    def _pass(self, mnt: Path, deadline: float) -> int:
        """Bytes read of the shards in name order, stopping at ``deadline``."""
        got = 0
        for n in self.names:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            got += reads.read_chunks(mnt / n, 1 << 20, left).nbytes
        return got

    def _write(self, rows: dict[str, dict[str, float]], depth_rows: dict[int, dict[str, float]]) -> None:
        mib = MiB
        out = [f"{len(self.names)} shards of JSON lines, {self.total / mib:.0f} MiB, {self.records:,} records, in one pool on a "
               f"local moto server; `--block-size {self.block // mib}MiB --buffer {self.buffer // mib}MiB`, 1 MiB "
               "reads of a fresh epoch (after a first open that builds the indexes), cut after "
               f"{self.b.args.max_seconds:g} s (`~`: counts of the part read, scaled to the epoch). `x data`: bytes "
               "fetched over the dataset's bytes.", "",
               "| view | GB/s | x none | MiB fetched / epoch | x data | GET requests / epoch | records / request | epoch change -> first byte ms |",
               "|---|---:|---:|---:|---:|---:|---:|---:|"]
        none = rows["none"]["gbps"]
        for s, r in rows.items():
            per = self.records / r["requests"] if r["requests"] else float("nan")
            cut = "~" if r["cut"] else ""
            out.append(f"| {s} | {r['gbps']:.3f} | {r['gbps'] / none:.2f} | {cut}{r['bytes'] / mib:.0f} | "
                       f"{cut}{r['bytes'] / self.total:.2f} | {cut}{r['requests']:,.0f} | {cut}{per:,.1f} | "
                       f"{r['first_ms']:.0f} |")
        out += ["", "`corgipile` by GET requests in flight (`--requests`):", "",
                "| requests in flight | GB/s | x 1 in flight |", "|---:|---:|---:|"]
        one = depth_rows[DEPTHS[0]]["gbps"]
        for d, r in depth_rows.items():
            out.append(f"| {d} | {r['gbps']:.3f} | {r['gbps'] / one:.2f} |")
        self.lines = out

