"""``shufflefs demo``: a label-sorted dataset, mounted, read twice, so the effect is visible at once.

Sorted-by-label data is the case where not shuffling hurts training most (CorgiPile's
clustered datasets): the first hundred source records all share one label, while the first
hundred records of a shuffled view (the default, stratified CorgiPile) mix several.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import TextIO

LABELS = ("cat", "dog", "bird", "fish")
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()

DEMO_MOUNT_OPTIONS = ["--block-size", "4KiB", "--buffer", "10%"]
"""Small blocks, so a 300 KB file has enough of them for a window to draw from several labels."""


def make_records(n: int = 2000, seed: int = 0) -> list[dict]:
    """``n`` records sorted by label (n/len(LABELS) of each), 100-200 bytes as JSON lines."""
    rnd = random.Random(seed)
    per = n // len(LABELS)
    out = []
    for i in range(n):
        label = LABELS[min(i // per, len(LABELS) - 1)]
        words = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(10, 20)))
        out.append({"id": i, "label": label, "x": round(rnd.uniform(-1, 1), 4), "text": words})
    return out


def write_dataset(directory: str | os.PathLike, n: int = 2000, seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``train.csv`` (same records, label-sorted) into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    records = make_records(n, seed)
    jsonl = d / "train.jsonl"
    with open(jsonl, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    table = d / "train.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "label", "x", "text"])
        for r in records:
            w.writerow([r["id"], r["label"], r["x"], r["text"]])
    return {"jsonl": jsonl, "csv": table}


def label_mix(lines: list[str]) -> str:
    counts = Counter(json.loads(line)["label"] for line in lines)
    return "  ".join(f"{label}={counts.get(label, 0)}" for label in LABELS)


def _head(path: Path, n: int) -> list[str]:
    out = []
    with open(path) as f:
        for line in f:
            out.append(line.rstrip("\n"))
            if len(out) == n:
                break
    return out


def _short(line: str, width: int = 96) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def _shufflefs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)


def run_demo(directory: str | None = None, keep: bool = False, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    base = Path(directory).resolve() if directory else Path(tempfile.mkdtemp(prefix="shufflefs-demo-"))
    created_base = directory is None or not base.exists()
    src, mnt, cache = base / "src", base / "mnt", base / "cache"
    mnt.mkdir(parents=True, exist_ok=True)
    files = write_dataset(src)
    view = mnt / files["jsonl"].name
    print(f"dataset: {files['jsonl']} and {files['csv'].name}, 2000 records sorted by label", file=out)
    print(f"mount:   shufflefs mount {src} {mnt} {' '.join(DEMO_MOUNT_OPTIONS)}", file=out)
    mounted = False
    try:
        r = _shufflefs("mount", str(src), str(mnt), *DEMO_MOUNT_OPTIONS, "--cache-dir", str(cache))
        if r.returncode != 0:
            print(f"shufflefs demo: mount failed:\n{r.stderr.rstrip()}", file=sys.stderr)
            return 1
        mounted = True
        source_head = _head(files["jsonl"], 100)
        heads = {}
        for epoch in (0, 1):
            os.setxattr(mnt, "user.shufflefs.epoch", str(epoch).encode())
            heads[epoch] = _head(view, 100)
            print(f"\nfirst records of {view} in epoch {epoch}:", file=out)
            for line in heads[epoch][:8]:
                print("  " + _short(line), file=out)
        csv_head = _head(mnt / files["csv"].name, 4)
        print(f"\nfirst lines of {mnt / files['csv'].name} in epoch 1 (the header stays first):", file=out)
        for line in csv_head:
            print("  " + _short(line), file=out)
        print("\nlabels among the first 100 records:", file=out)
        print(f"  source   {label_mix(source_head)}", file=out)
        for epoch, lines in heads.items():
            print(f"  epoch {epoch}  {label_mix(lines)}", file=out)
        return 0
    finally:
        if mounted:
            r = _shufflefs("umount", str(mnt))
            if r.returncode != 0:
                print(f"shufflefs demo: unmount failed:\n{r.stderr.rstrip()}", file=sys.stderr)
        if os.path.ismount(mnt):
            print(f"shufflefs demo: {mnt} is still mounted; files kept in {base}", file=sys.stderr)
        elif keep:
            print(f"\nfiles kept in {base}", file=out)
        elif created_base:
            shutil.rmtree(base, ignore_errors=True)
        else:
            for d in (src, mnt, cache):
                shutil.rmtree(d, ignore_errors=True)


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return run_demo(args.dir, keep=args.keep)
