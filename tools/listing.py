"""How fast a mounted directory of many small files lists, and what listing costs the daemon.

    python tools/listing.py [--files 100000] [--dir DIR] [--keep] [--code DIR]

Writes ``--files`` small files into one directory of a source tree (JSON lines, a quarter of
them without a final newline so that their views are one byte longer, and every tenth a plain
``.bin`` file shown as it is), then, each on a fresh mount so that no kernel cache helps, times
``ls -f`` (names only), ``ls -l`` (names, sizes, times) and ``find`` (walks the tree), next to
``ls -l`` of the source directory itself in the same run.  For each it reports the daemon's CPU
time (steadier than wall time when the machine is busy: the load average is printed), its
resident memory grown while listing (``RssAnon``) per entry, its peak, the inodes it holds
afterwards and the index cache entries written (listing must write none).  ``--code`` runs the
daemon of another checkout (``git archive COMMIT | tar -x -C DIR``) on the same files, to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MOUNT_TIMEOUT = 30.0
COMMANDS = {
    "ls -f": ["ls", "-f"],
    "ls -l": ["ls", "-l"],
    "find": ["find"],
}


def write_files(d: Path, n: int) -> None:
    """``n`` small files in ``d``: JSON lines (some without the last newline) and some pass-through."""
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        if i % 10 == 9:
            (d / f"blob{i:07d}.bin").write_bytes(b"x" * (i % 50))
        else:
            end = b"" if i % 4 == 0 else b"\n"
            (d / f"part{i:07d}.jsonl").write_bytes(b'{"i": %d}\n{"j": %d}' % (i, i) + end)


def mounted(mnt: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(mnt) for line in f)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads): steadier than wall time on a busy machine."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss(pid: int) -> dict[str, int]:
    """``RssAnon`` (the daemon's own memory) and ``VmHWM`` (its peak resident set), in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) * 1024
    return out


class Daemon:
    """One ``shufflefs mount -f`` started here and stopped by its PID."""

    def __init__(self, src: Path, mnt: Path, cache: Path, log: Path, code: Path = REPO) -> None:
        self.mnt, self.cache = mnt, cache
        mnt.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shufflefs", "mount", "-f", str(src), str(mnt), "--cache-dir", str(cache)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, cwd=code)  # -m: its own package
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not mounted(mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the mount did not come up; see {log}")
            time.sleep(0.02)

    def stats(self) -> dict:
        return json.loads(os.getxattr(self.mnt, "user.shufflefs.stats"))

    def stop(self) -> None:
        if self.proc.poll() is None and mounted(self.mnt):
            if subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True).returncode != 0:
                self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)


def timed(cmd: list[str], path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([*cmd, str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def cache_entries(cache: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(cache)) if cache.exists() else 0


def run(base: Path, n: int, code: Path = REPO) -> list[dict]:
    src = base / "src"
    d = src / "d"
    if not d.exists() or sum(1 for _ in os.scandir(d)) != n:
        shutil.rmtree(src, ignore_errors=True)
        t0 = time.perf_counter()
        write_files(d, n)
        print(f"wrote {n} files in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    baseline = timed(COMMANDS["ls -l"], d)
    rows = [{"command": "ls -l (source)", "seconds": baseline}]
    for name, cmd in COMMANDS.items():
        cache = base / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        daemon = Daemon(src, base / "mnt", cache, base / "daemon.log", code)
        try:
            before, cpu = rss(daemon.proc.pid), cpu_seconds(daemon.proc.pid)
            seconds = timed(cmd, daemon.mnt / "d")
            after, cpu = rss(daemon.proc.pid), cpu_seconds(daemon.proc.pid) - cpu
            inodes = daemon.stats()["inodes"]
        finally:
            daemon.stop()
        rows.append({
            "command": name, "seconds": seconds, "x source ls -l": seconds / baseline, "daemon cpu": cpu,
            "bytes per entry": (after["RssAnon"] - before["RssAnon"]) / n,
            "peak MiB": after["VmHWM"] / 2**20, "inodes held": inodes,
            "index cache entries": cache_entries(cache),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000, help="files in the listed directory")
    ap.add_argument("--dir", type=Path, help="work directory (default: a temporary one, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (reused by the next run)")
    ap.add_argument("--code", type=Path, default=REPO,
                    help="the shufflefs checkout whose daemon runs (default: this one)")
    args = ap.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="shufflefs-listing-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        rows = run(base, args.files, args.code.resolve())
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{args.files} files, one directory, code in {args.code}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'command':<16} {'seconds':>8} {'x source':>9} {'daemon cpu':>10} {'B/entry':>8} {'peak MiB':>9} "
          f"{'inodes':>7} {'cached':>7}")
    for r in rows:
        if "x source ls -l" not in r:
            print(f"{r['command']:<16} {r['seconds']:>8.2f}")
            continue
        print(f"{r['command']:<16} {r['seconds']:>8.2f} {r['x source ls -l']:>9.1f} {r['daemon cpu']:>10.2f} "
              f"{r['bytes per entry']:>8.0f} "
              f"{r['peak MiB']:>9.1f} {r['inodes held']:>7} {r['index cache entries']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
