#!/usr/bin/env python3
"""Source bytes per epoch with and without ``--stage-dir``, read through real mounts.

    python tools/bench.py --only staging [--records N] [--world W] [--exchange 0.1,0.25,0.5] [--epochs E]
                            [--block-size 256KiB] [--local uniform|corgipile] [--out FILE]

Generates a JSON lines file (log-normal record lengths) and, for each exchanged fraction Q, mounts
rank 0 of W twice in the same run: unstaged and staged.  Each epoch it reads both views with a
1 MiB read loop, checks that they are byte for byte equal, and takes from ``user.shufflefs.stats``
the record bytes each mount read from the source for that epoch.  Before the next epoch it waits
until the staged mount has built that epoch's stage in the background, as a training step would
give it time to.  Reported: source bytes per epoch of both, their ratio, and the rank's received
share of its partition from the view's ``user.shufflefs.info`` (what the ratio should approach);
the read times are of this machine, where the "shared" source is a local disk too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def make_data(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.0, 0.7, n), 1, 3000).astype(int)
    with open(path, "wb") as f:
        for i, t in enumerate(lengths.tolist()):
            f.write(json.dumps({"id": i, "text": "w" * t}).encode() + b"\n")


def shufflefs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "shufflefs", *args], check=True, cwd=REPO)


def stats(mnt: Path) -> dict:
    return json.loads(os.getxattr(mnt, "user.shufflefs.stats"))


def read_view(path: Path) -> tuple[str, float]:
    t0 = time.perf_counter()
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest(), time.perf_counter() - t0


def wait_staged(mnt: Path, epoch: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while epoch not in {s["epoch"] for s in stats(mnt)["staging"]["stages"]}:
        if time.monotonic() > deadline:
            raise SystemExit(f"the stage of epoch {epoch} was not built within {timeout} s")
        time.sleep(0.05)


def run(data: Path, work: Path, q: float, world: int, epochs: int, local: str, block: str) -> list[dict]:
    options = ["--strategy", "pls", "--exchange", str(q), "--world-size", str(world), "--rank", "0", "--block-size", block,
               "--pls-local", local, "--cache-dir", str(work / "cache")]
    rows = []
    with ExitStack() as stack:
        mounts = {}
        for kind in ("unstaged", "staged"):
            mnt = Path(tempfile.mkdtemp(dir=work, prefix=f"{kind}-"))
            extra = ["--stage-dir", str(work / "stage")] if kind == "staged" else []
            shufflefs("mount", str(data.parent), str(mnt), *options, *extra)
            stack.callback(shufflefs, "umount", str(mnt))
            mounts[kind] = mnt
        for epoch in range(epochs):
            got = {}
            for kind, mnt in mounts.items():
                shufflefs("epoch", str(mnt), str(epoch))
                got[kind] = read_view(mnt / data.name)
            if got["staged"][0] != got["unstaged"][0]:
                raise SystemExit(f"Q={q} epoch {epoch}: the staged view differs from the unstaged one")
            info = json.loads(os.getxattr(mounts["staged"] / data.name, "user.shufflefs.info"))
            src = {k: stats(m)["read_bytes"][str(epoch)]["source_bytes"] for k, m in mounts.items()}
            rows.append({"q": q, "epoch": epoch, "unstaged": src["unstaged"], "staged": src["staged"],
                         "received": info["received"] / info["partition_records"],
                         "t_unstaged": got["unstaged"][1], "t_staged": got["staged"][1]})
            wait_staged(mounts["staged"], epoch + 1)
    return rows


def table(rows: list[dict], records: int, world: int, block: str) -> str:
    out = [f"Record bytes rank 0 of {world} read from the source per epoch, {records} records, {block} blocks, "
           "unstaged and staged mounts of one run (views checked byte-identical).", "",
           "| Q | epoch | unstaged MiB | staged MiB | staged / unstaged | received / partition | "
           "read s unstaged | read s staged |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['q']:g} | {r['epoch']} | {r['unstaged'] / MiB:.1f} | {r['staged'] / MiB:.1f} | "
                   f"{r['staged'] / r['unstaged']:.3f} | {r['received']:.3f} | "
                   f"{r['t_unstaged']:.2f} | {r['t_staged']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=400_000)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--exchange", default="0.1,0.25,0.5")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--block-size", default="256KiB")
    p.add_argument("--local", choices=("uniform", "corgipile"), default="corgipile")
    p.add_argument("--out", help="also write the table here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shufflefs-staging-") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        data = work / "src" / "train.jsonl"
        make_data(data, a.records, 0)
        rows = []
        for q in (float(x) for x in a.exchange.split(",")):
            rows += run(data, work, q, a.world, a.epochs, a.local, a.block_size)
    text = table(rows, a.records, a.world, a.block_size)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
