"""How fast a mixture reads against the pool of the same files, in one run.

Two sources, ``a/`` and ``b/``, each holding the data file (hard links when they can be, else
copies).  The mixture takes every record of both at 1 : 1 (``samples`` left to its default), so
it holds exactly the pool's records; the pool is the two files declared with ``--pool``.  Each is
mounted alone with the same strategy and its shards read in name order with 1 MiB reads, warm
(the source read into the page cache just before), ``--rounds`` times each, alternating, a new
epoch every round; the medians and their ratio are printed, with the mixture's label mix
(``shufflefs inspect``'s TV per 100 records over the ``--label-field``, against a uniform
shuffle's) when the data has that field.

    python tools/bench.py --only mix-speed --data FILE.jsonl [--strategy stratified] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tools"), str(REPO)]
from .proc import FuseDaemon  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def place(data: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(data, dest)
    except OSError:
        shutil.copyfile(data, dest)


def read_all(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


def label_tv(path: Path, field: str) -> tuple[float, float] | None:
    """The blend's label mix and a uniform shuffle's (inspect's first column is the blend)."""
    r = subprocess.run([sys.executable, "-m", "shufflefs", "inspect", str(path), "--label-field", field, "--json"],
                       capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        return None
    got = json.loads(r.stdout)
    return next(iter(got["strategies"].values()))["label_tv"], got["uniform"]["label_tv"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a JSON-lines file (used twice)")
    ap.add_argument("--strategy", default="stratified")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label-field", default="label")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mixspeed-", dir=args.data.parent) as tmp:
        work = Path(tmp)
        src = work / "src"
        place(args.data, src / "a" / "x.jsonl")
        place(args.data, src / "b" / "y.jsonl")
        cfg = work / "mix.toml"
        cfg.write_text('[[mix]]\nname = "blend"\nshards = 2\n[[mix.source]]\nglob = "a/*.jsonl"\nweight = 1\n'
                       '[[mix.source]]\nglob = "b/*.jsonl"\nweight = 1\n')
        common = ["--strategy", args.strategy]
        options = {"pool": [*common, "--pool", "*/*.jsonl"], "mixture": [*common, "--config", str(cfg)]}
        rates: dict[str, list[float]] = {k: [] for k in options}
        tv: dict[str, tuple[float, float] | None] = {}
        for r in range(args.rounds + 1):  # round 0 builds the indexes
            for name, opts in options.items():
                # one mount at a time, the source warm: the views of one mount filling the page cache
                # must not push the source out of it for the other
                read_all([args.data])
                mnt = work / f"mnt-{name}{r}"
                mnt.mkdir()
                cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(src), str(mnt), "--cache-dir",
                       str(work / "cache"), *opts, "--epoch", str(r)]
                with FuseDaemon(cmd, mnt, work / f"{name}{r}.log", ENV):
                    paths = ([mnt / "a" / "x.jsonl", mnt / "b" / "y.jsonl"] if name == "pool" else
                             [mnt / ".mix" / "blend" / n for n in sorted(os.listdir(mnt / ".mix" / "blend"))])
                    t = time.perf_counter()
                    n = read_all(paths)
                    if r:
                        rates[name].append(n / (time.perf_counter() - t) / 1e6)
                    elif name == "mixture":
                        tv[name] = label_tv(paths[0], args.label_field)
        med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{args.data} twice, strategy {args.strategy}, warm, {args.rounds} rounds each")
    print("| order | MB/s (median) | rounds | label mix TV/100 of the blend (uniform) |")
    print("|---|---|---|---|")
    for k in rates:
        mix = tv.get(k)
        print(f"| {k} | {med[k]:.0f} | {', '.join(f'{x:.0f}' for x in rates[k])} | {'-' if mix is None else f'{mix[0]:.3f} ({mix[1]:.3f})'} |")
    print(f"mixture / pool: {med['mixture'] / med['pool']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
