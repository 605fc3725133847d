"""One node, measured per core here, projected to a larger node (`bench.node_model`).

    python tools/scale.py --node [--data DIR] [--strategies stratified,none] [--epochs 3] [--rounds 3] [--s3] ...

Mounts a directory holding one JSON lines file and reads warm epochs of its view with one
reader (1 MiB reads), taking each daemon thread's CPU from /proc/PID/task/*/stat: the thread
that receives requests (the main thread), the window build threads (trio's, "Trio thread N")
and the others (the compiled replies' threads; the rest idle).  Costs are CPU-seconds per GiB
served, which the machine's other load changes much less than the wall-clock rates; the first
strategy's are medians over all its warm runs.  Runs:

* each strategy with the default reply threads (build and reply costs);
* ``--python-replies`` (the trio thread's cost when Python answers every read);
* the source dropped from the page cache before each epoch (cold: the build threads' extra);
* ``--reply-threads 0, 1, 2`` in ``--rounds`` rotating rounds (the check: the model's GB/s for this
  machine against measured, beside each thread's run-queue wait from /proc/PID/task/*/schedstat,
  the time a shared machine's other work took from the reads);
* with ``--s3``, a view over the emulated link of `s3_link` (the daemon's CPU per GiB of GETs).

Then the projection for ``--cores`` (32) with its stated assumptions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import node_model as nm
from . import proc
from .s3_latency import ENV, lines_file

MiB = 1 << 20
GiB = 1 << 30
CLK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[int, tuple[str, float, float, float]]:
    """tid -> (name, user s, sys s, s waiting for a CPU while runnable) of every thread of ``pid``."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                st = f.read()
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                wait = int(f.read().split()[1]) / 1e9
        except FileNotFoundError:
            continue
        fields = st.rsplit(")", 1)[1].split()
        out[int(t)] = (st[st.index("(") + 1:st.rindex(")")], int(fields[11]) / CLK, int(fields[12]) / CLK, wait)
    return out


def own_wait() -> float:
    """Seconds this thread (the reader) has waited for a CPU while runnable."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def by_kind(pid: int, a: dict, b: dict) -> dict[str, tuple[float, float, float]]:
    """CPU (user, sys) and run-queue wait between snapshots ``a`` and ``b``: trio (main thread),
    build (trio's worker threads), other (reply threads and anything else)."""
    kinds = {"trio": [0.0, 0.0, 0.0], "build": [0.0, 0.0, 0.0], "other": [0.0, 0.0, 0.0]}
    for tid, (name, u, s, w) in b.items():
        u0, s0, w0 = a.get(tid, ("", 0.0, 0.0, 0.0))[1:]
        k = "trio" if tid == pid else "build" if name.startswith("Trio thread") else "other"
        kinds[k][0] += u - u0
        kinds[k][1] += s - s0
        kinds[k][2] += w - w0
    return {k: (v[0], v[1], v[2]) for k, v in kinds.items()}


def replied(mnt: Path) -> tuple[int, int]:
    """(FUSE reads answered, of which by the compiled replies) so far, from the mount's stats."""
    stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
    return stats.get("reads", 0), stats.get("compiled_replies", {}).get("replies", 0)


def load() -> float:
    return os.getloadavg()[0]


def drop(src: Path) -> None:
    """Evict the source's clean pages (cold epochs), without touching the rest of the machine."""
    for p in src.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@dataclass
class Run:
    """Per-GiB CPU by thread kind, the reader's, GB/s per epoch, load averages."""

    label: str
    cpu: dict[str, tuple[float, float]]
    reader: tuple[float, float]
    rates: list[float]
    loads: list[float]
    fetched: int = 0
    requests: int = 0
    wait: dict[str, float] | None = None
    """Seconds per GiB each thread kind (and "reader") waited for a CPU while runnable."""
    reads: int = 0
    compiled: int = 0
    """FUSE reads the daemon answered, and how many of them the compiled replies answered."""

    def per(self, kind: str) -> float:
        return sum(self.cpu[kind])


def epochs(label: str, src: Path, work: Path, args: argparse.Namespace, extra: list[str], cold: bool = False,
           remote: str | None = None) -> Run:
    """Mount, warm up (an epoch, not measured), then ``--epochs`` measured epochs."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", remote or str(src), str(mnt),
           "--cache-dir", str(work / "cache"), *extra]
    env = dict(os.environ, **ENV) if remote else None
    with proc.FuseDaemon(cmd, mnt, work / "daemon.log", env=env) as d:
        names = sorted(n for n in os.listdir(mnt) if not n.startswith("."))
        buf = bytearray(MiB)

        def epoch(e: int) -> int:
            os.setxattr(mnt, "user.shufflefs.epoch", str(e).encode())
            got = 0
            for name in names:
                fd = os.open(mnt / name, os.O_RDONLY)
                try:
                    while x := os.readv(fd, [buf]):
                        got += x
                finally:
                    os.close(fd)
            return got

        epoch(1000)
        total, rates, loads, fetched, requests = 0, [], [], 0, 0
        a, r0, w0, s0 = threads(d.pid), os.times(), own_wait(), replied(mnt)
        for e in range(args.epochs):
            if cold:
                drop(src)
            loads.append(load())
            t = time.perf_counter()
            got = epoch(e + 1)
            rates.append(got / (time.perf_counter() - t) / 1e9)
            total += got
            counts = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["read_bytes"].get(str(e + 1), {})
            fetched += counts.get("fetched_bytes", 0)
            requests += counts.get("source_requests", 0)
        b, r1, w1, s1 = threads(d.pid), os.times(), own_wait(), replied(mnt)
        spent = by_kind(d.pid, a, b)
    g = total / GiB
    cpu = {k: (u / g, s / g) for k, (u, s, _) in spent.items()}
    wait = {k: w / g for k, (_, _, w) in spent.items()} | {"reader": (w1 - w0) / g}
    run = Run(label, cpu, ((r1.user - r0.user) / g, (r1.system - r0.system) / g), rates, loads, fetched, requests, wait,
              s1[0] - s0[0], s1[1] - s0[1])
    print(f"  {label:32} {' '.join(f'{r:.2f}' for r in rates)} GB/s, load {statistics.mean(loads):.1f}; CPU-s/GiB "
          + ", ".join(f"{k} {u:.2f}+{s:.2f}" for k, (u, s) in cpu.items())
          + f", reader {run.reader[0]:.2f}+{run.reader[1]:.2f}; {run.reads} reads, {run.compiled} compiled", flush=True)
    return run


def s3_run(src: Path, work: Path, args: argparse.Namespace) -> Run:
    """The first strategy's view of the same file cut into 16 objects, over the emulated link."""
    from s3_link import EmulatedBucket, missing

    from .objstore import shards_of
    if (why := missing()) is not None:
        sys.exit(f"--s3: {why}")
    data = next(p for p in src.iterdir() if p.is_file())
    size = min(data.stat().st_size, args.s3_size)
    with EmulatedBucket(work / "server", args.rtt_ms / 1000, args.conn_rate, args.link_rate, ("data",)) as b:
        for i, body in enumerate(shards_of(data, size, 16)):
            b.put("data", f"ds/part-{i:05d}.jsonl", body)
        import subprocess
        subprocess.run([sys.executable, "-m", "shufflefs", "index", "s3://data/ds", "--publish", "--endpoint-url",
                        b.direct], check=True, capture_output=True, env=dict(os.environ, **ENV))
        (work / "s3").mkdir(exist_ok=True)
        extra = ["--strategy", args.strategies[0], "--endpoint-url", b.endpoint, *args.mount_args.split()]
        return epochs(f"s3 {args.strategies[0]}", src, work / "s3", args, extra, remote="s3://data/ds")


def span(xs: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(xs), min(xs), max(xs)


def merged(xs: list[Run]) -> Run:
    """Runs of equal size as one: mean CPU per GiB, every epoch's rate and load."""
    n = len(xs)
    cpu = {k: (sum(x.cpu[k][0] for x in xs) / n, sum(x.cpu[k][1] for x in xs) / n) for k in xs[0].cpu}
    reader = (sum(x.reader[0] for x in xs) / n, sum(x.reader[1] for x in xs) / n)
    wait = {k: sum(x.wait[k] for x in xs) / n for k in xs[0].wait} if xs[0].wait else None
    return Run(xs[0].label, cpu, reader, [r for x in xs for r in x.rates], [v for x in xs for v in x.loads], wait=wait)


def disk_rate(src: Path) -> float:
    """Bytes a second of a cold sequential read of the source (1 MiB reads), as this machine's disk gives."""
    drop(src)
    got, t = 0, time.perf_counter()
    buf = bytearray(MiB)
    for p in sorted(src.iterdir()):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                while x := os.readv(fd, [buf]):
                    got += x
            finally:
                os.close(fd)
    return got / (time.perf_counter() - t)


def table(rows: list[list[str]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def gbs(x: float) -> str:
    return "-" if x == float("inf") else f"{x / 1e9:.2f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="scale.py --node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a directory with one JSON lines file (default: 1 GiB generated)")
    ap.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    ap.add_argument("--strategies", default="stratified,none", type=lambda s: s.split(","))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--mount-args", default="", help="more mount options for every run")
    ap.add_argument("--cores", type=int, default=32)
    ap.add_argument("--reply-threads", type=int, default=2, help="the projected node's (default 2)")
    ap.add_argument("--build-threads", type=int, help="default: the daemon's rule, max(2, min(4, cores))")
    ap.add_argument("--mem-bw", type=float, default=100.0, help="GB/s of memory for copies (assumption, default 100)")
    ap.add_argument("--disk", type=float, default=7.0, help="GB/s of the source's disk, cold (assumption, default 7)")
    ap.add_argument("--nic", type=float, default=12.5, help="GB/s of the node's link (assumption, default 12.5)")
    ap.add_argument("--rtt-ms", type=float, default=30.0)
    ap.add_argument("--conn-rate", type=float, default=80e6, help="bytes/s per connection (default 80e6)")
    ap.add_argument("--link-rate", type=float, default=400e6, help="the emulated link's bytes/s (--s3)")
    ap.add_argument("--get-bytes", type=int, default=4 << 20, help="bytes per GET without --s3 (default 4 MiB: object storage's default block)")
    ap.add_argument("--requests", type=int, default=16, help="GETs in flight (mount --requests, default 16)")
    ap.add_argument("--s3", action="store_true", help="measure the daemon's CPU per GiB over the emulated link")
    ap.add_argument("--s3-size", type=int, default=512 * MiB)
    ap.add_argument("--no-check", action="store_true", help="skip the --reply-threads 0/1/2 runs")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the 0/1/2 reply threads check (default 3)")
    ap.add_argument("--costs", type=Path, help="project from a run's last line (its JSON costs) instead of measuring")
    args = ap.parse_args(argv)
    if args.costs:
        saved = json.loads(args.costs.read_text().strip().splitlines()[-1])
        project(args, nm.Costs(**saved["costs"]), saved["builds"], nm.Link(**saved["link"]))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="shufflefs-node-"))
    work.mkdir(parents=True, exist_ok=True)
    src = args.data
    if src is None:
        (work / "src").mkdir(exist_ok=True)
        src = lines_file(work / "src" / "lines.jsonl", GiB).parent
    here = os.cpu_count() or 1
    print(f"node model: {src}, {args.epochs} epochs a run, {here} CPUs here; rates per epoch, CPU-s per GiB as user+sys",
          flush=True)
    base = args.mount_args.split()
    runs = {s: epochs(f"{s}, reply threads 2", src, work, args, ["--strategy", s, "--reply-threads", "2", *base])
            for s in args.strategies}
    s0 = args.strategies[0]
    py = epochs(f"{s0}, --python-replies", src, work, args, ["--strategy", s0, "--python-replies", *base])
    cold = epochs(f"{s0}, cold (source dropped)", src, work, args, ["--strategy", s0, "--reply-threads", "2", *base],
                  cold=True)
    checks: dict[int, list[Run]] = {0: [], 1: [], 2: []}
    for rnd in range(0 if args.no_check else args.rounds):  # rotating order: the machine's load shared alike
        for r in (0, 1, 2)[rnd % 3:] + (0, 1, 2)[:rnd % 3]:
            checks[r].append(epochs(f"{s0}, reply threads {r}, round {rnd + 1}", src, work, args,
                                    ["--strategy", s0, "--reply-threads", str(r), *base]))
    remote = s3_run(src, work, args) if args.s3 else None
    disk_here = disk_rate(src)
    print(f"  cold sequential read of the source here: {disk_here / 1e9:.2f} GB/s", flush=True)

    warm = [runs[s0], py, *checks[0], *checks[1], *checks[2]]  # every warm run of the first strategy
    compiled = [runs[s0], *checks[1], *checks[2]]  # those whose replies are written by reply threads
    spread = {"trio": span([x.per("trio") for x in compiled]), "reply": span([x.per("other") for x in compiled]),
              "build": span([x.per("build") for x in warm]), "reader": span([sum(x.reader) for x in warm])}
    costs = nm.Costs(trio=spread["trio"][0], reply=spread["reply"][0], build=spread["build"][0],
                     reader=spread["reader"][0],
                     python_read=max(py.per("trio") - statistics.median(x.per("trio") + x.per("other") for x in compiled), 0.0),
                     cold=max(cold.per("build") - spread["build"][0], 0.0))
    reads = GiB / MiB
    print("\nmeasured (CPU-s per GiB served, each run summed over its epochs)\n")
    def med(k: str, n: int) -> str:
        return f"median of {n} runs, {spread[k][1]:.3f}-{spread[k][2]:.3f}"

    rows = [["trio thread: receive requests + Python per window", f"{costs.trio:.3f}", med("trio", len(compiled))],
            ["Python per read (--python-replies, minus trio + reply)", f"{costs.python_read:.3f}",
             f"one run: {costs.python_read / reads * 1e6:.0f} µs per 1 MiB read"],
            ["reply threads: writev into the page cache", f"{costs.reply:.3f}", med("reply", len(compiled))],
            [f"build threads, {s0}", f"{costs.build:.3f}", med("build", len(warm))]]
    rows += [[f"build threads, {s}", f"{x.per('build'):.3f}", "one run"] for s, x in runs.items() if s != s0]
    rows += [["reader: copy out of the page cache", f"{costs.reader:.3f}", med("reader", len(warm)) + " (its own process)"],
             [f"cold: build threads' extra, {s0}", f"{costs.cold:.3f}", "measured (source dropped before each epoch)"]]
    link = nm.Link(rate=args.nic * 1e9, conn_rate=args.conn_rate, rtt=args.rtt_ms / 1000, get_bytes=args.get_bytes,
                   in_flight=args.requests)
    if remote:
        per_get = remote.fetched / max(remote.requests, 1)
        link = replace(link, cpu=remote.per("trio") + remote.per("build") + remote.per("other"), trio=remote.per("trio"),
                       get_bytes=int(per_get) if remote.requests else args.get_bytes)
        rows.append([f"object storage: daemon, all threads ({s0})", f"{link.cpu:.3f}",
                     f"measured over the emulated link: trio thread {link.trio:.3f}, GET threads and the rest "
                     f"{remote.per('other'):.3f}, build {remote.per('build'):.3f}; {remote.reads} reads, "
                     f"{remote.compiled} by the compiled replies"])
        rows.append(["object storage: bytes per GET", f"{per_get / MiB:.2f} MiB",
                     f"measured: {remote.fetched / GiB:.2f} GiB fetched in "
                     f"{remote.requests} GETs"])
    print(table(rows, ["stage", "CPU-s / GiB", "source"]))

    builds = {s: (costs.build if s == s0 else x.per("build")) for s, x in runs.items()}
    project(args, costs, builds, link)
    if remote:
        here_link = replace(link, rate=args.link_rate)
        p = nm.remote(costs, nm.Node(cores=here, reply_threads=2, build_threads=max(2, min(4, here))), here_link)
        print(f"\nobject storage here (emulated link {args.link_rate / 1e6:g} MB/s, {args.rtt_ms:g} ms, "
              f"{args.conn_rate / 1e6:g} MB/s a connection, {args.requests} GETs in flight of "
              f"{link.get_bytes / MiB:.2f} MiB): model {gbs(p.rate)} GB/s ({p.bound}), measured "
              f"{statistics.median(remote.rates):.2f} GB/s (epochs {' '.join(f'{r:.2f}' for r in remote.rates)}, "
              f"load {statistics.mean(remote.loads):.1f}); GETs in flight allow {gbs(nm.get_rate(here_link))} GB/s")

    if checks[0]:
        print(f"\ncheck on this machine ({here} CPUs, build threads {max(2, min(4, here))}): the model from the "
              f"costs above, one reader; measured = median epoch of {args.rounds} rounds in rotating order, x 0 = "
              f"median of the rounds' ratios to 0 reply threads (load average alongside)\n")
        crow = []
        for n, xs in checks.items():
            x = merged(xs)
            ratio = statistics.median(statistics.median(a.rates) / statistics.median(b.rates)
                                      for a, b in zip(xs, checks[0]))
            h = nm.Node(cores=here, reply_threads=n, build_threads=max(2, min(4, here)), mem_bw=args.mem_bw * 1e9)
            p = nm.warm(costs, h)
            waits = x.wait["trio"] + x.wait["other"] + x.wait["reader"]  # the serial chain's threads
            crow.append([str(n), gbs(nm.one_reader(costs, h)), gbs(p.rate), p.bound,
                         gbs(nm.one_reader(costs, h, waits)), f"{waits:.2f}",
                         f"{statistics.median(x.rates):.2f}", f"{min(x.rates):.2f}-{max(x.rates):.2f}", f"{ratio:.2f}",
                         f"{statistics.mean(x.loads):.1f}", f"{x.per('trio'):.2f}", f"{x.per('other'):.2f}",
                         f"{x.per('build'):.2f}", f"{sum(x.reader):.2f}"])
        print(table(crow, ["reply threads", "model: one reader", "model: saturated", "saturates",
                           "model + run-queue waits", "waits s/GiB", "measured GB/s",
                           "range", "x 0", "load", "trio CPU-s/GiB", "reply", "build", "reader"]))
    print("\n" + json.dumps({"costs": costs.__dict__, "link": link.__dict__, "builds": builds}))


def project(args: argparse.Namespace, costs: nm.Costs, builds: dict[str, float], link: nm.Link) -> None:
    """The projected node's table: each strategy warm and cold, and object storage if measured
    (``link.cpu``) at ``--requests`` and 256 GETs in flight."""
    threads = args.build_threads or max(2, min(4, args.cores))
    node = nm.Node(cores=args.cores, reply_threads=args.reply_threads, build_threads=threads, mem_bw=args.mem_bw * 1e9,
                   disk=args.disk * 1e9)
    link = replace(link, rate=args.nic * 1e9, conn_rate=args.conn_rate, rtt=args.rtt_ms / 1000, in_flight=args.requests)
    print(f"\nprojection: {args.cores} cores, {args.reply_threads} reply threads, {threads} build threads; assumed: "
          f"memory {args.mem_bw:g} GB/s for copies ({node.copies:g} copies a byte), disk {args.disk:g} GB/s, NIC "
          f"{args.nic:g} GB/s, {args.requests} GETs in flight of {link.get_bytes / MiB:.2f} MiB "
          f"({'measured' if link.cpu else '--get-bytes'}), {args.rtt_ms:g} ms, {args.conn_rate / 1e6:g} MB/s a connection\n")
    prow = []
    first = next(iter(builds))
    for s, b in builds.items():
        c = replace(costs, build=b)
        for name, p in (("warm", nm.warm(c, node)), ("cold", nm.cold(c, node))):
            prow.append([f"{name} {s}", gbs(p.rate), p.bound] + [gbs(p.limits.get(k, float("inf"))) for k in LIMITS])
    if link.cpu:
        for n in sorted({args.requests, 256}):
            p = nm.remote(costs, node, replace(link, in_flight=n))
            prow.append([f"object storage {first}, {n} GETs in flight", gbs(p.rate), p.bound]
                        + [gbs(p.limits.get(k, float("inf"))) for k in LIMITS])
    print(table(prow, ["view", "GB/s", "saturates"] + list(LIMITS)))


LIMITS = ("trio thread", "reply threads", "build threads", "cores", "memory bandwidth", "disk", "GETs in flight", "NIC")
