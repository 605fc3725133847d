#!/usr/bin/env python3
"""Cold epochs of the default Parquet view, with the machine's free page reporting as it is and held back.

    python tools/bench.py --only parquet-cold --data DIR [--rows 2000000] [--rounds 6] [--update-docs]

A virtual machine that reports its free memory to the host gives back the pages that dropping
the page cache frees, within seconds (`page_reporting`).  A cold epoch of a Parquet view needs
about twice the new pages of the source's read (its stage read back from disk, the next epoch's
stage written), so how long it takes depends on whether the host took those pages back
meanwhile.

This section reads what `parquet` reads in its cold row (blocks of epochs after one in a mount,
the page cache dropped before each, against as many reads of the source) in alternated rounds,
with reporting as the machine has it and held back: a freed page is not reported until it has
been free for a minute (``min_free_ms``, the longest the kernel takes, where it has it).  Before
that, the cost of 1 GiB of new page-cache pages written 6 s after dropping the caches, under
each setting.  The setting is restored in a ``finally`` (and on SIGTERM; after a SIGKILL, by
the next run: `page_reporting.LEFT`).  Needs root; without the knob, only the first setting is
run.

Prints a markdown section; ``--update-docs`` puts it in docs/benchmark.md between its markers.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
from pathlib import Path

from .docs import write_section
from .parquet_data import ensure_data
from .parquet_views import NAME, REPO, cold_epochs, file_options, iterate, stamp_of
from .page_reporting import KNOBS, in_turn, new_pages, setting
from .page_reporting import settings as reporting_settings
from .proc import FuseDaemon, can_drop_caches

START, END = "<!-- parquet-cold:start -->", "<!-- parquet-cold:end -->"
EPOCHS = 3
"""Cold epochs read per round and setting, back to back (one block of `parquet_views.cold_epochs`)."""
TARGET = 0.7


def run(data: Path, rows: int, rounds: int, group_rows: int, text: str = "letters") -> str:
    if not can_drop_caches():
        raise SystemExit("parquet-cold: dropping the page cache needs root")
    src_dir = data / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    src = src_dir / NAME
    ensure_data(src, rows, group_rows, text)
    path, settings = reporting_settings()
    before = path.read_text().strip() if path is not None else None
    costs = {what: [] for what, _ in settings}
    for _ in range(2):
        for what, value in settings:
            with setting(path, value):
                costs[what].append(new_pages(data))
    mnt, cache = data / "mnt", data / "cache"
    mnt.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(src_dir), str(mnt), "--cache-dir", str(cache)]
    view = mnt / NAME
    got: dict[str, list[float]] = {what: [] for what, _ in settings}
    with FuseDaemon(cmd, mnt, data / "daemon.log", env) as d:
        for epoch in (0, 1):  # the copy filled, the next stage built
            os.setxattr(view, "user.shufflefs.epoch", str(epoch).encode())
            iterate(view)
        epoch = 2
        for r in range(rounds):
            for what, value in in_turn(settings, r):
                with setting(path, value):
                    for v, s, *_ in cold_epochs(d.pid, view, src, epoch, 1, EPOCHS):
                        got[what].append(v / s)
                epoch += EPOCHS
    if path is not None:
        assert path.read_text().strip() == before, "the setting was not restored"
    out = [f"Source: {src.stat().st_size / 2**30:.2f} GiB, {rows:,} rows sorted by label, text of {text}. Machine: {os.cpu_count()} "
           f"CPUs, kernel {os.uname().release}. Free page reporting: "
           + (f"{KNOBS} (`{path.name}` {before} as the machine has it)." if path is not None
              else "no setting this process may write: one setting run."), "",
           "| free page reporting | 1 GiB of new page-cache pages, 6 s after dropping the cache | blocks of cold "
           "epochs, view / source: median (range) | blocks under 0.7x |", "|---|---|---|---|"]
    for what, _ in settings:
        x = sorted(got[what])
        out.append(f"| {what} | {' s, '.join(f'{c:.2f}' for c in costs[what])} s | {statistics.median(x):.2f}x "
                   f"({x[0]:.2f}-{x[-1]:.2f}) | {sum(v < TARGET for v in x)} of {len(x)} |")
    out += ["", f"Each block as in the `parquet` section's cold row: {EPOCHS} epochs back to back, the page cache "
            "dropped before each, against as many reads of the source read so; one block per round and setting, "
            f"{rounds} rounds, the settings alternated, one mount."]
    return "\n".join(out)


def update_docs(text: str, stamp: str) -> Path:
    return write_section(REPO / "docs" / "benchmark.md", START, END, "Parquet cold epochs and free page reporting",
                         stamp, text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    file_options(ap, rounds=6)  # --data: the `parquet` section's directory serves
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the setting is restored on the way out
    text = run(args.data, args.rows, args.rounds, args.group_rows, args.text)
    print(text)
    if args.update_docs:
        print("wrote", update_docs(text, stamp_of("parquet-cold", args)))


if __name__ == "__main__":
    main()
