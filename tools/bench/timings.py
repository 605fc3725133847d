"""The benchmark's timing sections: index build rate, remount -> first byte with a cached index,
and epoch change -> first byte (functions of the run's `Bench`, ``b``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from bench import data, proc, reads
from bench.report import MiB
from shufflefs.cli.mount import daemon_python
from shufflefs.config import format_size, parse_size
from shufflefs.formats import load_or_build_index, make_format, scan_file
from shufflefs.index.table import IndexCache
from shufflefs.strategies import make_plan

REMOUNT_WIDTHS = (100, 9)
"""Bytes per line of the remount datasets (the first is the one the target is judged on)."""
EPOCH_ATTR = "user.shufflefs.epoch"


def run_index(b: Any) -> None:
    lines = ["| file | records | MB | scan s | GB/s | records/s |", "|---|---|---|---|---|---|"]
    for ds in b.datasets:
        fmt = make_format("lines") if ds.record_size is None else make_format("fixed", {"record_size": ds.record_size})
        reads.warm(ds.path)
        best = min(_timed(lambda: scan_file(str(ds.path), fmt)) for _ in range(3))
        lines.append(f"| {ds.path.name} ({fmt.name}) | {ds.n:,} | {ds.size / 1e6:.0f} | {best:.3f} | "
                     f"{ds.size / best / 1e9:.2f} | {ds.n / best:,.0f} |")
        if ds.name == "lines":
            b.index_gbps = ds.size / best / 1e9
    lines.append("")
    lines.append("Warm page cache, best of 3, `shufflefs.formats.scan_file` (the scan `shufflefs index` and the "
                 "daemon's index workers run).")
    b.report.section("Index build", lines)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_remount(b: Any) -> None:
    """Mount -> first byte with a cached index, for lines of 100 bytes (the target) and of 9
    bytes, where one 64 MiB window holds ~7 M records and building it dominates."""
    n = parse_size(b.args.remount_records)
    lines = ["| records of | run | cache | mount ready s | open -> first byte s | total s | records in window 0 | "
             "daemon peak RSS MiB | bound MiB |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for width in REMOUNT_WIDTHS:
        totals, note = _remount(b, n, width, lines)
        if width == REMOUNT_WIDTHS[0]:
            b.remount_s = statistics.median(totals)
        notes.append(note)
    lines += ["", f"{n:,} records, corgipile; " + "; ".join(notes) + ". Timed from starting `shufflefs mount -f` "
              "to the first 4 KiB read of the view; the target is judged on the first record size."]
    b.report.section("Remount with a cached index", lines)


def _remount(b: Any, n: int, width: int, lines: list[str]) -> tuple[list[float], str]:
    src = b.work / f"src-remount-{width}"
    src.mkdir(exist_ok=True)
    path = src / data.SHORT_NAME
    data.ensure(path, data.make_short_lines, n, width)
    t0 = time.perf_counter()
    subprocess.run([*daemon_python(), "index", str(src), "--cache-dir", str(b.cache_dir)],
                   check=True, env=b.env, capture_output=True)
    built = time.perf_counter() - t0
    mnt = b.work / "mnt-remount"
    mnt.mkdir(exist_ok=True)
    spec = b.spec("corgipile")
    index = load_or_build_index(str(path), make_format("lines"), IndexCache(b.cache_dir))
    plan = make_plan(index, spec, 0)
    window = int(max(plan.window_sizes))
    first_window = len(plan.window(0))
    bound = 16 * n + 3 * window + 100 * MiB
    totals = []
    runs = [("warm", i) for i in range(3)] + ([("cold", 0)] if b.cold else [])
    for cache, i in runs:
        if cache == "cold":
            proc.drop_caches()
        else:
            reads.warm(path)
        cmd = b.shufflefs_cmd(src, mnt, "corgipile", "--log-file", str(b.logs / "remount.log"))
        with proc.FuseDaemon(cmd, mnt, b.logs / "remount.out", env=b.env) as d:
            t0 = time.perf_counter()
            fd = os.open(mnt / path.name, os.O_RDONLY)
            try:
                got = os.read(fd, 4096)
            finally:
                os.close(fd)
            first = time.perf_counter() - t0
            assert got, "empty read"
            rss = proc.peak_rss(d.pid)
        total = d.ready_s + first
        if cache == "warm":
            totals.append(total)
        lines.append(f"| {width} B | {i + 1} | {cache} | {d.ready_s:.3f} | {first:.3f} | {total:.3f} | "
                     f"{first_window:,} | {rss / MiB:.0f} | {bound / MiB:.0f} |")
    size = path.stat().st_size / 1e6
    return totals, f"{width}-byte lines: {size:.0f} MB, index built once by `shufflefs index` in {built:.2f} s"


def run_epoch(b: Any) -> None:
    ds = next((d for d in b.datasets if d.name == "lines"), b.datasets[0])
    mnt = b.work / "mnt-epoch"
    mnt.mkdir(exist_ok=True)
    cmd = b.shufflefs_cmd(b.src, mnt, "corgipile", "--log-file", str(b.logs / "epoch.log"))
    reads.warm(ds.path)
    setx, cli, later, same, other = [], [], [], [], []
    with proc.FuseDaemon(cmd, mnt, b.logs / "epoch.out", env=b.env):
        target = mnt / ds.path.name
        first_byte(target)  # epoch 0 opened and served once: the index is loaded, the daemon warm
        e = 0
        for _ in range(b.args.epochs):
            e += 1
            t0 = time.perf_counter()
            os.setxattr(mnt, EPOCH_ATTR, str(e).encode())
            first_byte(target)
            setx.append(time.perf_counter() - t0)
            e += 1
            t0 = time.perf_counter()
            subprocess.run([*daemon_python(), "epoch", str(mnt), str(e)], check=True, env=b.env)
            first_byte(target)
            cli.append(time.perf_counter() - t0)
            e += 1
            os.setxattr(mnt, EPOCH_ATTR, str(e).encode())
            time.sleep(0.5)
            t0 = time.perf_counter()
            first_byte(target)
            later.append(time.perf_counter() - t0)
            for layouts, times in ((SAME_LAYOUT, same), (OTHER_LAYOUT, other)):
                e += 1
                state = json.dumps({"epoch": e, "views": {target.name: layouts}}).encode()
                t0 = time.perf_counter()
                os.setxattr(mnt, RESUME_ATTR, state)
                first_byte(target)
                times.append(time.perf_counter() - t0)
    med = statistics.median
    b.epoch_first_s = med(setx)
    b.resume_first_s = (med(same), med(other))
    window = format_size(parse_size(b.args.buffer)) if not b.args.buffer.endswith("%") else b.args.buffer
    b.report.section("Epoch change -> first byte (corgipile)", [
        "| how the epoch is set | median ms | min ms | max ms |", "|---|---|---|---|",
        f"| setxattr, then open + read 4 KiB at once | {med(setx) * 1e3:.1f} | {min(setx) * 1e3:.1f} | {max(setx) * 1e3:.1f} |",
        f"| `shufflefs epoch MNT N` (a new Python process), then open + read | {med(cli) * 1e3:.1f} | "
        f"{min(cli) * 1e3:.1f} | {max(cli) * 1e3:.1f} |",
        f"| setxattr, 0.5 s pause, then open + read (timed from open) | {med(later) * 1e3:.1f} | "
        f"{min(later) * 1e3:.1f} | {max(later) * 1e3:.1f} |",
        f"| resume (`user.shufflefs.resume`) on the view's own layout, then open + read | {med(same) * 1e3:.1f} | "
        f"{min(same) * 1e3:.1f} | {max(same) * 1e3:.1f} |",
        f"| resume after a stop on 2 ranks (every first-layout view planned), then open + read | "
        f"{med(other) * 1e3:.1f} | {min(other) * 1e3:.1f} | {max(other) * 1e3:.1f} |",
        "", f"{ds.path.name}, buffer {window}, block {b.args.block_size}, warm source, "
        f"{b.args.epochs} epoch changes of each kind.",
    ])


SAME_LAYOUT = [{"world_size": 1, "parts": 1, "consumed": [[1000]]}]
OTHER_LAYOUT = [{"world_size": 2, "parts": 1, "consumed": [[1000], [500]]}]
"""Resume states of the epoch section: a stop on the mount's own layout (1 rank), and on two
ranks (the mount plans both ranks' views of the first layout to cut their rests)."""
RESUME_ATTR = "user.shufflefs.resume"


def first_byte(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)
