"""Data larger than memory: a raw read of the source, the `none` view, the default view
(`stratified`) and `full`, with the daemon and the reader in one memory cgroup well below the
dataset's size, so that the page cache cannot hold the file.

    sudo python tools/lirs_penalty.py [--size 2GiB] [--memory SIZE|large] [--rounds 3]
        [--strategies raw,none,stratified,full] [--max-seconds 30] [--dir DIR] [--data DIR]

Needs root and a cgroup v1 memory controller (/sys/fs/cgroup/memory) or cgroup v2 with the memory
controller.  Generates JSON lines of ~1 KiB sorted by label (tools/bench/data.py) and prebuilds
the index (``--data DIR`` keeps both in DIR for the next run), then for each round reads every
entry in turn, the order rotated from round to round: drops the page cache, mounts inside the
cgroup and reads the view with 1 MiB reads from a process in the same cgroup (cut after
``--max-seconds``, the rate taken from what was read); ``raw`` reads the source file itself the
same way.  An entry ``NAME:opt=value,...`` mounts strategy NAME with ``--opt value``
(``stratified:source-cache=keep``).  ``--memory`` defaults to 1/4 of ``--size``; ``large`` sets no
limit (nothing is under pressure).

Prints, per entry, the median GB/s of the rounds (and their range), the CPU seconds per GB read
of the daemon (its process, all threads, from mounted to unmount) and of the reader, and the
per-round ratios stratified / none and none / raw (median and range), then `shufflefs advise`'s
random-read table for the same storage.  The cgroup, the mounts and the daemons are removed in
``finally`` blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path[:0] = [str(TOOLS), str(REPO)]
from bench import data  # noqa: E402
from shufflefs.cli.mount import daemon_python  # noqa: E402
from shufflefs.config import parse_size  # noqa: E402

READER = """
import os, sys, time
path, limit = sys.argv[1], float(sys.argv[2])
buf = bytearray(1 << 20); fd = os.open(path, os.O_RDONLY); n = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < limit:
    k = os.readv(fd, [buf])
    if not k:
        break
    n += k
t = os.times()
print(n, time.perf_counter() - t0, t.user + t.system)
"""
"""1 MiB reads of a file for at most ``limit`` s: bytes, seconds, the reader's own CPU seconds."""

TICK = os.sysconf("SC_CLK_TCK")


class Cgroup:
    """A memory cgroup (v1 or v2) that processes join with `wrap`; ``limit`` None: no limit."""

    def __init__(self, limit: int | None) -> None:
        v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
        name = f"shufflefs-lirs-{os.getpid()}"
        if (v1 / "memory.limit_in_bytes").exists():
            self.path = v1 / name
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit if limit is not None else -1))
        elif "memory" in (v2 / "cgroup.controllers").read_text():
            self.path = v2 / name
            self.path.mkdir()
            (self.path / "memory.max").write_text(str(limit) if limit is not None else "max")
        else:
            raise SystemExit("lirs_penalty: no memory cgroup controller here")

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run as a member of the cgroup (it joins, then execs)."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *cmd]

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def read_file(path: Path, cg: Cgroup, max_seconds: float) -> tuple[int, float, float]:
    """1 MiB reads of ``path`` by a process in ``cg``: (bytes, seconds, the reader's CPU s)."""
    r = subprocess.run(cg.wrap([sys.executable, "-c", READER, str(path), str(max_seconds)]),
                       capture_output=True, text=True, check=True)
    nbytes, seconds, cpu = r.stdout.split()
    return int(nbytes), float(seconds), float(cpu)


def raw(src: Path, cg: Cgroup, max_seconds: float) -> dict:
    """A cold read of the source file itself in ``cg`` (what the disk and page cache give)."""
    drop_caches()
    nbytes, seconds, cpu = read_file(src / "lines.jsonl", cg, max_seconds)
    return {"gbps": nbytes / seconds / 1e9, "bytes": nbytes, "reader_cpu": cpu, "daemon_cpu": 0.0}


def run_view(strategy: str, src: Path, work: Path, cg: Cgroup, max_seconds: float, block: str, buffer: str,
             cache_dir: Path | None = None, extra: list[str] | None = None) -> dict:
    """Cold 1 MiB reads of ``src``'s lines.jsonl through a mount of ``strategy`` (mount options
    ``extra``), daemon and reader in ``cg``: GB/s, bytes, CPU s of the daemon and the reader while
    it read, and the mount's stats."""
    mnt = work / f"mnt-{strategy}"
    mnt.mkdir(exist_ok=True)
    cache = cache_dir or work / "cache"
    cmd = cg.wrap([*daemon_python(), "mount", "-f", str(src), str(mnt), "--cache-dir", str(cache),
                   "--strategy", strategy, "--block-size", block, "--buffer", buffer, *(extra or [])])
    drop_caches()
    daemon = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(work / f"{strategy}.log", "wb"))
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lirs_penalty: {strategy} mount failed: {(work / f'{strategy}.log').read_text()}")
            time.sleep(0.05)
        before = cpu_seconds(daemon.pid)  # sh execs the daemon: the same pid
        nbytes, seconds, reader_cpu = read_file(mnt / "lines.jsonl", cg, max_seconds)
        daemon_cpu = cpu_seconds(daemon.pid) - before
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        return {"gbps": nbytes / seconds / 1e9, "bytes": nbytes, "reader_cpu": reader_cpu,
                "daemon_cpu": daemon_cpu, "uptime": float(stats.get("uptime_s", 0)), "stats": stats}
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def measure(strategy: str, src: Path, work: Path, cg: Cgroup, max_seconds: float, block: str, buffer: str,
            cache_dir: Path | None = None) -> tuple[float, int, float]:
    """`run_view` as (GB/s, bytes read, daemon uptime s)."""
    got = run_view(strategy, src, work, cg, max_seconds, block, buffer, cache_dir)
    return got["gbps"], got["bytes"], got["uptime"]


def entry_args(entry: str) -> tuple[str, list[str]]:
    """``NAME:opt=value,...`` -> (NAME, ["--opt", "value", ...])."""
    name, _, opts = entry.partition(":")
    extra: list[str] = []
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition("=")
        extra += [f"--{key}", value] if value else [f"--{key}"]
    return name, extra


def prepare(src: Path, cache: Path, size: int) -> None:
    """The dataset and its index in ``src`` and ``cache``, made unless a file of ``size`` is there."""
    path = src / "lines.jsonl"
    if path.exists() and abs(path.stat().st_size - size) < (4 << 20):
        return
    src.mkdir(parents=True, exist_ok=True)
    data.make_lines(path, size)
    subprocess.run([*daemon_python(), "index", str(src), "--cache-dir", str(cache)], check=True, capture_output=True)


def _span(values: list[float], fmt: str = ".3f") -> str:
    med = statistics.median(values)
    return f"{med:{fmt}}" + (f" ({min(values):{fmt}}-{max(values):{fmt}})" if len(values) > 1 else "")


def report(entries: list[str], rounds: list[dict[str, dict]]) -> None:
    print("| entry | GB/s, median (range) | daemon CPU-s/GB | reader CPU-s/GB | stat: source cache |")
    print("|---|---:|---:|---:|---|")
    for e in entries:
        got = [r[e] for r in rounds if e in r]
        rate = [g["gbps"] for g in got]
        dcpu = [g["daemon_cpu"] / (g["bytes"] / 1e9) for g in got]
        rcpu = [g["reader_cpu"] / (g["bytes"] / 1e9) for g in got]
        modes = sorted({json.dumps(g["stats"].get("source_cache", {}).get("views", {}), sort_keys=True)
                        for g in got if "stats" in g})
        print(f"| {e} | {_span(rate)} | {_span(dcpu, '.2f')} | {_span(rcpu, '.2f')} | {' '.join(modes) or '-'} |")
    print()
    for a, b in (("stratified", "none"), ("none", "raw")):
        pairs = [r[a]["gbps"] / r[b]["gbps"] for r in rounds if a in r and b in r and r[b]["gbps"]]
        if pairs:
            print(f"{a} / {b}: {_span(pairs, '.2f')}  (per round: {', '.join(f'{p:.2f}' for p in pairs)})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB")
    p.add_argument("--memory", default=None, help="memory limit of the cgroup (daemon + reader + their page cache); "
                   "default 1/4 of --size; 'large': no limit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument("--block-size", default="auto")
    p.add_argument("--buffer", default="64MiB")
    p.add_argument("--strategies", default="raw,none,stratified,full")
    p.add_argument("--dir", default=None, help="where the temporary files go")
    p.add_argument("--data", default=None, help="keep the dataset and its index here (reused when the size matches)")
    p.add_argument("--no-advise", action="store_true", help="skip `shufflefs advise`'s table")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("lirs_penalty: needs root (cgroups, dropping caches, mounts)")
    size = parse_size(args.size)
    limit = None if args.memory == "large" else parse_size(args.memory) if args.memory else size // 4
    entries = args.strategies.split(",")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        home = Path(args.data) if args.data else work
        src, cache = home / "src", home / "cache"
        prepare(src, cache, size)
        cg = Cgroup(limit)
        rounds: list[dict[str, dict]] = []
        try:
            for i in range(args.rounds):
                order = entries[i % len(entries):] + entries[: i % len(entries)]
                got: dict[str, dict] = {}
                for e in order:
                    if e == "raw":
                        got[e] = raw(src, cg, args.max_seconds)
                    else:
                        name, extra = entry_args(e)
                        got[e] = run_view(name, src, work, cg, args.max_seconds, args.block_size, args.buffer,
                                          cache, extra)
                    print(f"round {i + 1}: {e} {got[e]['gbps']:.3f} GB/s", file=sys.stderr, flush=True)
                rounds.append(got)
        finally:
            cg.remove()
        advise = None if args.no_advise else subprocess.run(
            [*daemon_python(), "advise", str(src), "--budget", "256MiB", "--no-save"], capture_output=True, text=True)
    memory = "no limit" if limit is None else f"{limit / 2**20:,.0f} MiB"
    print(f"cold reads of a {size / 2**30:.1f} GiB JSON lines file (~1 KiB records, sorted by label), daemon and "
          f"reader in a memory cgroup of {memory}; 1 MiB reads, cut after {args.max_seconds:g} s; "
          f"--block-size {args.block_size} --buffer {args.buffer}; {args.rounds} round(s), order rotated\n")
    report(entries, rounds)
    if advise is not None:
        print("\n`shufflefs advise` on the same storage:\n")
        print(advise.stdout.strip() or advise.stderr.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
