#!/usr/bin/env python3
"""Shared mappings and read speed of views, per serving mode, in one run on one machine.

    python tools/mmap_modes.py --src DIR --file big.jsonl [--csv table.csv]
        [--mode NAME[:KEY=VALUE,...]]... [--code DIR] [--strategies none,corgipile] [--rounds 3]

A mode is a daemon started with extra environment (``PYTHONPATH`` and ``LD_LIBRARY_PATH`` values
are prepended to the current ones; ``{mode}`` and ``{strategy}`` in a value are replaced, e.g. for
one log file per daemon), such as a prototype's switches or a pyfuse3 built against another
libfuse; ``--code`` is the shufflefs the daemons import (default: this checkout).  Two keys are
not environment: ``args`` adds mount options (``+`` separates them: ``args=--direct-io``) and ``ra``
sets the mount's readahead in KiB once it serves (bdi ``read_ahead_kb``, root), e.g.
``--mode dio:args=--direct-io --mode ra4:ra=4096``.  Every mode is mounted once per strategy, all
at once; then:

  checks  on one epoch of each mode's first strategy: ``mmap`` (MAP_SHARED and MAP_PRIVATE,
          PROT_READ) of the views of ``--file`` and ``--csv``, the mapped bytes compared with
          ``pread`` of the same descriptor; ``numpy.memmap``, ``pyarrow.memory_map``,
          ``pandas.read_csv`` and ``polars.read_csv`` of the CSV view, compared with the same
          reader on the bytes read from the view
  speed   ``--rounds`` rounds, the order of the mounts rotated each round: a new epoch, then the
          view of ``--file`` read front to back with 1 MiB reads (the source warm in the page
          cache; the view's pages dropped after each pass); median GB/s per mount, its ratio to
          the first mode, and corgipile/none per mode

The mount's readahead (bdi ``read_ahead_kb``) is reported as the daemon left it.  Daemons are
ended by PID and every mount is unmounted in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import errno
import io
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path[:0] = [str(TOOLS)]

from bench import proc, reads  # noqa: E402

EPOCH_ATTR = "user.shufflefs.epoch"
CHUNK = 16 << 20
PATH_VARS = ("PYTHONPATH", "LD_LIBRARY_PATH")


MODE_KEYS = ("args", "ra")
"""Keys of a mode that are not environment variables."""


def parse_mode(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    env = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"mmap_modes: --mode {text!r}: {item!r} is not KEY=VALUE")
        env[key] = value
    return name, env


def daemon_env(code: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    for key, value in extra.items():
        env[key] = os.pathsep.join(filter(None, [value, env.get(key)])) if key in PATH_VARS else value
    return env


def _knob(mnt: Path) -> Path:
    dev = os.stat(mnt).st_dev
    return Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")


def readahead_kb(mnt: Path) -> str:
    try:
        return _knob(mnt).read_text().strip()
    except OSError as e:
        return f"? ({e.strerror})"


def compare_mapping(fd: int, size: int, flags: int) -> str:
    """'ok', 'DIFFERENT at N' or the errno of the mmap."""
    try:
        mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)
    except OSError as e:
        return errno_name(e)
    try:
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            try:
                mapped = mm[off:off + n]
            except Exception as e:  # noqa: BLE001 -- SIGBUS surfaces as a crash, others reported
                return f"read of the mapping failed at {off}: {e!r}"
            if mapped != os.pread(fd, n, off):
                return f"DIFFERENT in [{off}, {off + n})"
        return "ok"
    finally:
        mm.close()


def errno_name(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


def attempt(fn) -> str:
    try:
        return fn()
    except OSError as e:
        return f"{errno_name(e)} ({type(e).__name__})"
    except Exception as e:  # noqa: BLE001 -- a reader's own error type, reported as is
        text = str(e).splitlines()[0][:80] if str(e) else ""
        return f"{type(e).__name__}: {text}"


def csv_checks(view: Path) -> dict[str, str]:
    """Readers that map the CSV view, each compared with the same reader on its read() bytes."""
    out: dict[str, str] = {}
    data = view.read_bytes()
    try:
        import numpy as np
        out["numpy.memmap"] = attempt(
            lambda: "ok" if np.array_equal(np.memmap(view, np.uint8, mode="r"), np.frombuffer(data, np.uint8))
            else "DIFFERENT")
    except ImportError:
        out["numpy.memmap"] = "not installed"
    try:
        import pyarrow as pa

        def arrow() -> str:
            with pa.memory_map(str(view), "r") as f:
                return "ok" if f.read_buffer().to_pybytes() == data else "DIFFERENT"
        out["pyarrow.memory_map"] = attempt(arrow)
    except ImportError:
        out["pyarrow.memory_map"] = "not installed"
    try:
        import pandas as pd
        out["pandas.read_csv"] = attempt(
            lambda: "ok" if pd.read_csv(view).equals(pd.read_csv(io.BytesIO(data))) else "DIFFERENT")
    except ImportError:
        out["pandas.read_csv"] = "not installed"
    try:
        import polars as pl
        out["polars.read_csv"] = attempt(
            lambda: "ok" if pl.read_csv(view).equals(pl.read_csv(io.BytesIO(data))) else "DIFFERENT")
    except ImportError:
        out["polars.read_csv"] = "not installed"
    return out


def map_checks(view: Path) -> dict[str, str]:
    fd = os.open(view, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return {"MAP_SHARED": compare_mapping(fd, size, mmap.MAP_SHARED),
                "MAP_PRIVATE": compare_mapping(fd, size, mmap.MAP_PRIVATE)}
    finally:
        os.close(fd)


def timed_pass(view: Path) -> float:
    """GB/s of one front-to-back read with 1 MiB reads; the view's pages dropped afterwards."""
    r = reads.read_chunks(view, 1 << 20, float("inf"))
    fd = os.open(view, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return r.nbytes / r.seconds / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="the source directory to mount")
    ap.add_argument("--file", required=True, help="the file (relative to --src) whose view is read for speed")
    ap.add_argument("--csv", help="a CSV file (relative to --src) for the readers' checks")
    ap.add_argument("--mode", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                    help="a daemon configuration (repeat; the first is the baseline of the ratios)")
    ap.add_argument("--code", default=str(REPO), help="the shufflefs the daemons run (default: this checkout)")
    ap.add_argument("--strategies", default="none,corgipile")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mount-args", default="", help="extra arguments of every mount")
    ap.add_argument("--work", help="directory for mount points, logs and the index cache (default: a temporary one)")
    args = ap.parse_args()

    modes = [parse_mode(m) for m in args.mode] or [("current", {})]
    strategies = [s for s in args.strategies.split(",") if s]
    src = Path(args.src).resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix="mmap_modes."))
    code = Path(args.code).resolve()
    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for name in filter(None, [args.file, args.csv]):
        reads.warm(src / name)

    daemons: dict[tuple[str, str], proc.FuseDaemon] = {}
    try:
        for name, extra in modes:
            for strategy in strategies:
                mnt = work / f"mnt-{name}-{strategy}"
                mnt.mkdir(exist_ok=True)
                cmd = [sys.executable, "-P", "-m", "shufflefs", "mount", "-f", str(src), str(mnt),
                       "--cache-dir", str(cache), "--strategy", strategy, *args.mount_args.split(),
                       *filter(None, extra.get("args", "").split("+"))]
                env = daemon_env(code, {k: v.replace("{mode}", name).replace("{strategy}", strategy)
                                        for k, v in extra.items() if k not in MODE_KEYS})
                d = proc.FuseDaemon(cmd, mnt, work / f"{name}-{strategy}.log", env)
                daemons[(name, strategy)] = d.start()
        time.sleep(0.5)  # the daemons set their readahead once serving
        for (name, strategy), d in daemons.items():
            ra = dict(modes)[name].get("ra")
            if ra:
                _knob(d.mountpoint).write_text(ra)
        print(f"source {src / args.file}: {(src / args.file).stat().st_size / 1e9:.2f} GB; code {code}")
        for (name, strategy), d in daemons.items():
            print(f"  {name:14} {strategy:10} pid {d.pid:7}  read_ahead_kb {readahead_kb(d.mountpoint)}")

        print("\nchecks (one epoch; mapped bytes compared with pread of the same descriptor)")
        for name, _ in modes:
            mnt = daemons[(name, strategies[0])].mountpoint
            os.setxattr(mnt, EPOCH_ATTR, b"1")
            results = {f"{args.file} {k}": v for k, v in map_checks(mnt / args.file).items()}
            if args.csv:
                results.update({f"{args.csv} {k}": v for k, v in map_checks(mnt / args.csv).items()})
                results.update({f"{args.csv} {k}": v for k, v in csv_checks(mnt / args.csv).items()})
            for what, result in results.items():
                print(f"  {name:14} {what:34} {result}")

        speeds: dict[tuple[str, str], list[float]] = {key: [] for key in daemons}
        keys = list(daemons)
        epoch = 100
        for r in range(args.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for key in order:
                mnt = daemons[key].mountpoint
                epoch += 1
                os.setxattr(mnt, EPOCH_ATTR, str(epoch).encode())
                speeds[key].append(timed_pass(mnt / args.file))
            print(f"  round {r + 1}: " + ", ".join(f"{k[0]}/{k[1]} {speeds[k][-1]:.2f}" for k in keys), flush=True)

        base = modes[0][0]
        print(f"\nspeed: median GB/s of {args.rounds} rounds, 1 MiB reads, warm source "
              f"(ratio to {base}; corgipile/none)")
        med = {k: statistics.median(v) for k, v in speeds.items()}
        for name, _ in modes:
            cells = []
            for s in strategies:
                ratio = med[(name, s)] / med[(base, s)]
                cells.append(f"{s} {med[(name, s)]:6.2f} ({ratio:4.2f}x)")
            if "none" in strategies and "corgipile" in strategies:
                cells.append(f"corgipile/none {med[(name, 'corgipile')] / med[(name, 'none')]:.2f}")
            print(f"  {name:14} " + "   ".join(cells))
    finally:
        for d in daemons.values():
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
