#!/usr/bin/env python3
"""Parquet views against pyarrow reading the source file itself.

    python tools/bench.py --only parquet --data DIR [--rows 2000000] [--rounds 3] [--update-docs]

On a label-sorted Parquet file of at least 1 GiB (generated into DIR once, `parquet_data`: id,
label, a text of random letters or, ``--text words``, of words as prose has them, a score, a
list<int32> and a dictionary-encoded string, snappy, row groups of 100,000 rows, as pyarrow
writes them), mounted with default options:

* what a view costs before its first byte: the index (first ``stat``: every row group decoded
  once), the decoded copy (filled by the first epoch's reads);
* rows/s of ``pyarrow.parquet.ParquetFile.iter_batches`` over the source (warm: in the page
  cache) and over the view at the same path (a new epoch each round, the copy made), in paired
  rounds (the order of the two alternates), with the label mix per 100 rows each got; cold, in
  blocks of epochs back to back, each after dropping the page cache, against as many reads of
  the source (`cold_epochs`); and the first epoch of later mounts, which take the copy the
  mount before kept, warm and cold (the page cache dropped before the view's read and before
  the source's it is paired with), at an epoch no mount staged (read at once, and after a job's
  start-up) and at the epoch after the one the mount before read, whose stage that mount built
  and kept (`parquet_later`);
* the default view against the `none` view of the file, mounted side by side: rows/s, and the
  label mix ``shufflefs inspect`` reports (`parquet_none`);
* time from an epoch change to the first row group (``ParquetFile(view).read_row_group(0)``);
* the daemon's memory (own: anonymous + shared pages; RSS) against the bound;
* beside them, HF ``datasets`` as users shuffle with it (``load_dataset``, ``.shuffle()``, then
  batches; its Arrow conversion timed apart);
* what decoding source row groups for each window (no copy) would cost the default order.

Prints a markdown section; ``--update-docs`` puts it in docs/benchmark.md between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


from .docs import write_section
from .parquet_data import TEXTS, ensure_data
from .parquet_later import LATER_ROUNDS, later_rounds
from .parquet_none import against_none
from .parquet_peers import hf_datasets, label_mix, litdata_parquet
from .parquet_shards import EPOCHS as SHARD_EPOCHS, SHARDS, make_shards, shard_rounds
from .proc import FuseDaemon, Sampler, can_drop_caches, drop_caches

REPO = Path(__file__).resolve().parents[2]
START, END = "<!-- parquet-bench:start -->", "<!-- parquet-bench:end -->"
NAME = "sorted.parquet"
BLOCK = 4
"""Epochs a paired round reads of each, back to back."""
COLD_BLOCK = 3
"""Cold epochs read back to back per block (`cold_epochs`).  One cold epoch paired with one source
read measured neither alone: the stage of the view's next epoch, built while it is read, went on
into the source read after it when the view's read ended first, and on this VM the first read of
a pair after a drop was often the slower one, whichever it was (a view epoch copied to a regular
file against the source: 1.39-1.61x first, 0.72x second)."""


def iterate(path: Path, first: list[float] | None = None) -> tuple[int, float, np.ndarray]:
    """``iter_batches`` over ``path`` with default arguments: rows, seconds, the labels got; the
    seconds from the open to the first batch appended to ``first``, if given."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    n, labels = 0, []
    for batch in pq.ParquetFile(path).iter_batches():
        if first is not None and not labels:
            first.append(time.perf_counter() - t0)
        n += batch.num_rows
        labels.append(batch.column("label").to_numpy())
    return n, time.perf_counter() - t0, np.concatenate(labels)


def iterate_without_hints(path: Path) -> tuple[int, float, np.ndarray]:
    """``iter_batches(pre_buffer=False)``: pyarrow reads each column chunk when it decodes it,
    without first hinting every range of the file (``POSIX_FADV_WILLNEED``)."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    n, labels = 0, []
    for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches():
        n += batch.num_rows
        labels.append(batch.column("label").to_numpy())
    return n, time.perf_counter() - t0, np.concatenate(labels)


def cpu_seconds() -> float:
    """This process's CPU time so far (the reader's, all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def front_to_back(path: Path) -> tuple[int, float]:
    """Bytes and seconds of reading ``path`` front to back, 1 MiB at a time."""
    t0, n = time.perf_counter(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n, time.perf_counter() - t0


def first_row_group(view: Path, epoch: int) -> float:
    """Seconds from setting a new epoch on ``view`` to its first row group read back."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    os.setxattr(view, "user.shufflefs.epoch", str(epoch).encode())
    pq.ParquetFile(view).read_row_group(0)
    return time.perf_counter() - t0


def without_copy(src: Path) -> str:
    """How many source row groups the default order's windows draw from, per epoch: what a
    view would decode if it decoded source row groups for each window instead of a copy."""
    from shufflefs.formats import make_format, scan_file
    from shufflefs.strategies import make_plan
    from shufflefs.strategies.base import ShuffleSpec

    index = scan_file(src, make_format("parquet"))
    plan = make_plan(index, ShuffleSpec(), 1, 0, 1)
    draws = [len(np.unique(index.sizes.group_of(np.asarray(plan.window(k), np.int64)))) for k in range(plan.n_windows)]
    groups = len(index.footer.group_rows)
    return (f"The default order (`stratified`, 64 MiB buffer, {plan.spec.block_size >> 10} KiB blocks) has "
            f"{plan.n_windows} windows over the file's {groups} row groups; each draws rows from {min(draws)}-"
            f"{max(draws)} of them, so decoding source row groups per window (no copy) would decode "
            f"{sum(draws)} row groups per epoch, {sum(draws) / groups:.1f} times the file.")


def encode_rate(src: Path, work: Path) -> tuple[float, float, int]:
    """In one process, without FUSE: seconds to fill a decoded copy of ``src``, then to encode
    every window of an epoch of the default order from it, and the view's bytes."""
    from shufflefs.formats import make_format, scan_file
    from shufflefs.sources.local import SourceFile
    from shufflefs.stages.parquet_rows import RowCopies
    from shufflefs.strategies import make_plan
    from shufflefs.strategies.base import ShuffleSpec
    from shufflefs.stages.parquet_view import ParquetLayout, ParquetView

    shutil.rmtree(work, ignore_errors=True)  # no copy an earlier run kept (`kept_copies`)
    index = scan_file(src, make_format("parquet"))
    plan = make_plan(index, ShuffleSpec(), 1, 0, 1)
    layout = ParquetLayout(index, plan)
    copies = RowCopies(work)
    source = SourceFile(str(src), index.stamp)
    copy = copies.acquire(str(src), index)
    view = ParquetView(str(src), index, plan, layout, source, copy, lambda: copies.release(copy))
    try:
        t0 = time.perf_counter()
        copy.ensure(np.arange(len(index.footer.group_rows)), source)
        fill = time.perf_counter() - t0
        out = np.empty(int(np.diff(layout.window_starts).max(initial=0)), np.uint8)
        t0 = time.perf_counter()
        for k in range(layout.n_windows):
            view.load_window(k, out)
        return fill, time.perf_counter() - t0, layout.size
    finally:
        view.close()
        copies.close()
        shutil.rmtree(work, ignore_errors=True)


def run(data: Path, rows: int, rounds: int, group_rows: int, peers: bool, text: str = "letters") -> str:
    import pyarrow.parquet as pq

    data.mkdir(parents=True, exist_ok=True)
    src_dir = data / "src"
    src_dir.mkdir(exist_ok=True)
    src = src_dir / NAME
    ensure_data(src, rows, group_rows, text)
    md = pq.ParquetFile(src).metadata
    out = [f"Source: {src.stat().st_size / 2**30:.2f} GiB, {md.num_rows:,} rows sorted by label (10 labels), "
           f"{md.num_row_groups} row groups of {group_rows:,} rows, text of {text} (`parquet_data`), snappy (pyarrow's "
           f"defaults). Machine: "
           f"{os.cpu_count()} CPUs. Load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.", ""]
    mnt, cache = data / "mnt", data / "cache"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(src_dir), str(mnt), "--cache-dir", str(cache)]
    view = mnt / NAME
    table = ["| read | rows/s | x source | label mix /100 (uniform) | daemon CPU s | daemon own / RSS MiB |",
             "|---|---|---|---|---|---|"]
    with FuseDaemon(cmd, mnt, data / "daemon.log", env) as d:
        iterate(src)  # into the page cache
        t0 = time.perf_counter()
        size = os.stat(view).st_size  # indexes the file
        index_s = time.perf_counter() - t0
        with Sampler(d.pid) as s:
            n, t, labels = iterate(view)  # epoch 0: fills the decoded copy
        assert n == md.num_rows
        mix, uniform = label_mix(labels)
        u = s.usage
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        copy = next(iter(stats["parquet_copies"]["copies"].values()))
        first_own = u.peak_own
        first_epoch = (f"| view, first epoch (fills the copy) | {n / t:,.0f} | - | {mix:.3f} ({uniform:.3f}) | "
                       f"{u.cpu_s:.1f} | {u.peak_own / 2**20:.0f} / {u.peak_rss / 2**20:.0f} |")
        src_rates, view_rates, ratios, own, rss, cpu, src_cpu, opened = [], [], [], [], [], [], [], []
        loads = [json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["memory"]["loads"]]
        for r in range(rounds):
            # a round: BLOCK epochs of each back to back, as a training loop reads them (the view's
            # epoch set in the timed loop; a stage may be built while the epoch before is read);
            # the first view epoch of a block is timed apart: nothing was read before it
            got = {}
            for what in (("source", "view") if r % 2 == 0 else ("view", "source")):
                if what == "source":
                    c0, t0, n = cpu_seconds(), time.perf_counter(), 0
                    for _ in range(BLOCK - 1):
                        n += iterate(src)[0]
                    src_labels = iterate(src)[2]
                    got["source"] = (n + len(src_labels)) / (time.perf_counter() - t0)
                    src_cpu.append((cpu_seconds() - c0) / BLOCK)
                else:
                    first = 1000 * (r + 1)
                    t0 = time.perf_counter()
                    os.setxattr(view, "user.shufflefs.epoch", str(first).encode())
                    opened.append(iterate(view)[0] / (time.perf_counter() - t0))
                    with Sampler(d.pid) as s:
                        t0, n = time.perf_counter(), 0
                        for e in range(first + 1, first + BLOCK):
                            os.setxattr(view, "user.shufflefs.epoch", str(e).encode())
                            m, _, labels = iterate(view)
                            n += m
                        got["view"] = n / (time.perf_counter() - t0)
                    own.append(s.usage.peak_own)
                    rss.append(s.usage.peak_rss)
                    cpu.append(s.usage.cpu_s / (BLOCK - 1))
            loads.append(json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["memory"]["loads"])
            src_rates.append(got["source"])
            view_rates.append(got["view"])
            ratios.append(got["view"] / got["source"])
        mix_src, _ = label_mix(src_labels)
        mix, uniform = label_mix(labels)
        warm_mix = mix
        table.append(f"| source, pyarrow (warm) | {statistics.median(src_rates):,.0f} | 1.00 | {mix_src:.3f} "
                     f"({uniform:.3f}) | - | - |")
        passthrough = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["passthrough"]
        how = (f"read by the kernel from stages, {passthrough['staged_ahead']} of {passthrough['stages_built']} "
               "built while the epoch before was read" if passthrough["on"] else
               f"served by the daemon, {statistics.median(np.diff(loads)) / (BLOCK - 1):.0f} window loads per epoch")
        table.append(f"| view, warm: epochs 2-{BLOCK} of {rounds} paired blocks of {BLOCK} epochs back to back, the "
                     f"epoch change included ({how}) | {statistics.median(view_rates):,.0f} | "
                     f"{statistics.median(ratios):.2f} | {mix:.3f} ({uniform:.3f}) | {statistics.median(cpu):.1f} | "
                     f"{max(own) / 2**20:.0f} / {max(rss) / 2**20:.0f} |")
        table.append(f"| view, warm: the first epoch of each block (its stage, if any, made at its open) | "
                     f"{statistics.median(opened):,.0f} | {statistics.median(opened) / statistics.median(src_rates):.2f} "
                     f"| - | - | - |")
        table.append(first_epoch)
        loads0 = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["memory"]["loads"]
        os.setxattr(view, "user.shufflefs.epoch", b"50")
        with Sampler(d.pid) as s:
            n, t, labels = iterate_without_hints(view)
        loads1 = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["memory"]["loads"]
        mix, uniform = label_mix(labels)
        table.append(f"| view, `iter_batches(pre_buffer=False)` ({loads1 - loads0} window loads) | {n / t:,.0f} | "
                     f"{n / t / statistics.median(src_rates):.2f} | {mix:.3f} ({uniform:.3f}) | {s.usage.cpu_s:.1f} | "
                     f"{s.usage.peak_own / 2**20:.0f} / {s.usage.peak_rss / 2**20:.0f} |")
        os.setxattr(view, "user.shufflefs.epoch", b"51")
        with Sampler(d.pid) as s:
            nbytes, t = front_to_back(view)
        front_cpu = s.usage.cpu_s
        loads2 = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["memory"]["loads"]
        table.append(f"| view read front to back, 1 MiB reads ({loads2 - loads1} window loads): "
                     f"{nbytes / t / 1e9:.2f} GB/s | {md.num_rows / t:,.0f} | - | - | {s.usage.cpu_s:.1f} | "
                     f"{s.usage.peak_own / 2**20:.0f} / {s.usage.peak_rss / 2**20:.0f} |")
        # the ceiling without FUSE: an epoch's view as a regular file, in the page cache
        os.setxattr(view, "user.shufflefs.epoch", b"52")
        as_file = data / "view-as-file.parquet"
        shutil.copyfile(view, as_file)
        iterate(as_file)
        file_rates, file_cpu = [], []
        for _ in range(rounds):
            c0 = cpu_seconds()
            n, t, _ = iterate(as_file)
            file_cpu.append(cpu_seconds() - c0)
            file_rates.append(n / t)
        as_file.unlink()
        table.append(f"| an epoch's view copied to a regular file (warm; no FUSE, no encoding: the ceiling) | "
                     f"{statistics.median(file_rates):,.0f} | {statistics.median(file_rates) / statistics.median(src_rates):.2f} "
                     f"| - | - | - |")
        firsts = [first_row_group(view, 100 + e) for e in range(5)]
        firsts_cold: list[float] = []
        if can_drop_caches():  # steady epochs read cold, as data larger than memory is read
            os.setxattr(view, "user.shufflefs.epoch", b"199")  # its stage made at its open, the next one's ahead
            iterate(view)
            cold = cold_epochs(d.pid, view, src, 200, LATER_ROUNDS)
            table.append(median_row(f"view, cold: blocks of {COLD_BLOCK} epochs after one in a mount, the page cache "
                                    "dropped before each (the sync and drop in the time), against as many reads of the "
                                    "source read so, the order alternated (each stage, built while the epoch before "
                                    "was read, read back from disk)", cold, uniform))
            later_cold = {"cold: the epochs after one in a mount": cold}
            firsts_cold = [first_row_group(view, 300 + e) for e in range(5)]  # the stage files' pages dropped
        else:
            later_cold = {}
        info = json.loads(os.getxattr(view, "user.shufflefs.info"))
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
    later, later_firsts, startups = later_rounds(cmd, mnt, view, src, data / "daemon.log", env, md.num_rows, iterate)
    table += [median_row(f"view, first epoch of a later mount, {what}", got, uniform) for what, got in later.items()]
    against = against_none(src_dir, NAME, data, cache, env, rounds, iterate)
    shard_dir = data / "shards"
    names = make_shards(src, shard_dir)
    shard_cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(shard_dir), str(mnt), "--cache-dir", str(cache)]
    shards, shard_firsts = shard_rounds(shard_cmd, shard_dir, mnt, data / "daemon.log", env, names, rounds, iterate)
    shard_what = (f"{SHARDS} shards of the file (`train-0000k-of-0000{SHARDS}.parquet`, pooled) read in turn, warm: "
                  f"epochs 2-{SHARD_EPOCHS + 1} of blocks of {SHARD_EPOCHS + 1} back to back against "
                  f"{SHARD_EPOCHS} epochs of the same loop over the source shards")
    table.append(median_row(f"view, {shard_what}", shards, uniform))
    shard_src = statistics.median(g[1] for g in shards)
    table.append(f"| view, {SHARDS} shards, warm: the first epoch of each block (an epoch jump: its first stages made "
                 f"at the shards' opens) | {statistics.median(shard_firsts):,.0f} | "
                 f"{statistics.median(shard_firsts) / shard_src:.2f} | - | - | - |")
    if peers:
        table += hf_datasets(src, 200_000)
        table += litdata_parquet(src, 50_000)
    fill, encode, view_bytes = encode_rate(src, data / "copies")
    per_round = ", ".join(f"{x:.2f}" for x in ratios)
    out += ["`iter_batches` with default arguments over the source and over the view at the same path (default "
            "mount options: `stratified`, 64 MiB buffer; warm: the source in the page cache, the index cached, the "
            f"copy made; passthrough {'on' if passthrough['on'] else 'off: ' + passthrough.get('why_not', '')}; "
            f"per round, view / source: {per_round}):", ""]
    out += table + [""] + against + [""]
    limit = int(stats["memory"]["limit_bytes"])  # three windows and the loads' working memory
    bound = 16 * md.num_rows + limit + 100 * 2**20
    out += [f"- Index at the first lookup: {index_s:.1f} s (every row group decoded once; cached by version); "
            f"view {size / 2**30:.2f} GiB ({size / src.stat().st_size:.2f}x the source: PLAIN, uncompressed), "
            f"{info['parquet']['row_groups']} row groups of up to {info['parquet']['rows_per_row_group']:,} rows, "
            f"loaded as {info['parquet']['windows']} windows of about 8 MiB.",
            f"- Decoded copy: {copy['bytes'] / 2**30:.2f} GiB on local disk, filled in {copy['seconds']:.1f} s "
            "during the first epoch's reads.",
            f"- Epoch change -> first row group (`setxattr`, then `ParquetFile(view).read_row_group(0)`; 5 epochs "
            f"not built ahead): warm, median {statistics.median(firsts) * 1e3:.0f} ms, max {max(firsts) * 1e3:.0f} ms"
            + (f"; right after the cold rows (the stage files' pages dropped, so written into new ones), median "
               f"{statistics.median(firsts_cold) * 1e3:.0f} ms, max {max(firsts_cold) * 1e3:.0f} ms" if firsts_cold
               else "") + ".",
            f"- Daemon memory bound (16 bytes/row + 3 windows + 100 MiB): {bound / 2**20:.0f} MiB; windows in memory "
            f"at most {limit / 2**20:.0f} MiB.",
            f"- In one process, without FUSE, on one core: the copy filled in {fill:.1f} s, an epoch's "
            f"{info['parquet']['windows']} windows encoded from it in {encode:.2f} s ({view_bytes / encode / 1e9:.2f} GB/s "
            "of view bytes); " + ("with passthrough the daemon's CPU above is each epoch's stage (encoded once, "
                                  "front to back, and written to the page cache) and the kernel's readahead of the "
                                  "view's own pages, answered from the stage." if passthrough["on"] else
                                  "the rest of the daemon's CPU above is serving the reads (1 MiB FUSE requests) "
                                  "and windows loaded again."),
            f"- {without_copy(src)}",
            budget_line(md.num_rows / statistics.median(src_rates),
                        statistics.median(file_cpu), statistics.median(cpu), front_cpu),
            *startups]
    ratio, first = statistics.median(ratios), max(firsts + firsts_cold)
    cold_rows = [f"| the same, {what.split(' (')[0]} | {_ratio(got):.2f}x | {_verdict(_ratio(got) >= 0.7)} |"
                 for what, got in later_cold.items()]
    out += ["", "Targets, on epochs read in turn in a mount:", "", "| target | measured | verdict |", "|---|---|---|",
            f"| `iter_batches` over the view >= 0.7x the source's rows/s | {ratio:.2f}x | "
            f"{_verdict(ratio >= 0.7)} |", *cold_rows,
            f"| epoch change -> first row group < 2 s (1 GiB), the slowest | {first:.2f} s | "
            f"{_verdict(first < 2)} |",
            f"| daemon's own memory within 16 B/row + 3 windows + 100 MiB, warm | {max(own) / 2**20:.0f} of "
            f"{bound / 2**20:.0f} MiB | {_verdict(max(own) <= bound)} |",
            f"| the same while the copy is filled (first epoch) | {first_own / 2**20:.0f} of {bound / 2**20:.0f} MiB | "
            f"{'met' if first_own <= bound else 'not met: the decoding of a column chunk on top'} |",
            f"| label mix per 100 rows within 2x of uniform | {warm_mix:.3f} against {uniform:.3f} | "
            f"{_verdict(warm_mix <= 2 * uniform)} |"]
    out += ["", "The same two bars on first epochs of later mounts (an epoch change: from the open to the first batch, "
            "with the view's build at the open, if any) and on shards:", "",
            "| case | x source | >= 0.7x | open -> first batch, median (max) | < 2 s |", "|---|---|---|---|---|"]
    for what, got in later.items():
        opened = later_firsts[what]
        out.append(f"| first epoch of a later mount, {what.split(' (')[0]} | {_ratio(got):.2f}x | "
                   f"{_verdict(_ratio(got) >= 0.7)} | {statistics.median(opened):.2f} s ({max(opened):.2f}) | "
                   f"{_verdict(max(opened) < 2)} |")
    out.append(f"| {SHARDS} shards read in turn | {_ratio(shards):.2f}x | {_verdict(_ratio(shards) >= 0.7)} | - | - |")
    out.append(f"\nLoad average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    return "\n".join(out)


def _ratio(got: list[tuple]) -> float:
    """The median of rounds' view / source rows/s."""
    return statistics.median(g[0] / g[1] for g in got)


def _verdict(met: bool) -> str:
    return "met" if met else "not met"


def median_row(what: str, got: list[tuple], uniform: float) -> str:
    """A table row of rounds (view rows/s, source rows/s, daemon usage, label mix): the median
    round's rate and ratio (the range of the ratios), its daemon CPU, the peak memory of all."""
    ratios = [g[0] / g[1] for g in got]
    k = int(np.argsort(ratios)[len(ratios) // 2])
    rate, _, usage, mix = got[k]
    return (f"| {what} (median of {len(got)}) | {rate:,.0f} | {ratios[k]:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {mix:.3f} ({uniform:.3f}) | {usage.cpu_s:.1f} | {max(g[2].peak_own for g in got) / 2**20:.0f} / "
            f"{max(g[2].peak_rss for g in got) / 2**20:.0f} |")


def cold_epochs(pid: int, view: Path, src: Path, first: int, blocks: int, per_block: int = COLD_BLOCK) -> list[tuple]:
    """``blocks`` blocks of ``per_block`` epochs of ``view`` from epoch ``first`` on, back to back,
    each read after dropping the page cache (its ``sync`` and drop inside the time, as a reader of
    data larger than memory meets them), against as many reads of the source in the same way; the
    view's block first in even blocks, the source's in odd ones.  Per block: (view rows/s, source
    rows/s, daemon usage over the view's block, label mix of its last epoch)."""
    got = []
    for b in range(blocks):
        rates: dict[str, float] = {}
        for what in ("view", "source") if b % 2 == 0 else ("source", "view"):
            rows = 0
            with Sampler(pid if what == "view" else None) as s:
                t0 = time.perf_counter()
                for e in range(first + b * per_block, first + (b + 1) * per_block):
                    drop_caches()
                    if what == "view":
                        os.setxattr(view, "user.shufflefs.epoch", str(e).encode())
                    n, _, labels = iterate(view if what == "view" else src)
                    rows += n
                rates[what] = rows / (time.perf_counter() - t0)
            if what == "view":
                usage, mix = s.usage, label_mix(labels)[0]
        got.append((rates["view"], rates["source"], usage, mix))
    return got


def budget_line(src_epoch: float, reader_cpu: float, daemon_cpu: float, front_cpu: float) -> str:
    """What the machine's CPUs allow: an epoch through the mount needs the reader's CPU (as over a
    regular file) and the daemon's; on n CPUs it cannot take less than their sum over n."""
    n = os.cpu_count() or 1
    floor = (reader_cpu + daemon_cpu) / n
    floor_front = (reader_cpu + front_cpu) / n
    return (f"- CPU budget: the reader took {reader_cpu:.2f} CPU-s per epoch over the view as a regular file; the "
            f"daemon {daemon_cpu:.1f} CPU-s per warm epoch of `iter_batches` ({front_cpu:.1f} read front to back). "
            f"On {n} CPUs an epoch through the mount cannot take less than {floor:.2f} s ({floor_front:.2f} s with the "
            f"front-to-back daemon CPU), where the source took {src_epoch:.2f} s: at most "
            f"{src_epoch / floor:.2f}x ({src_epoch / floor_front:.2f}x) of the source's rows/s with perfect overlap.")


def update_docs(text: str, stamp: str, kind: str = "letters") -> Path:
    """Into its section of docs/benchmark.md: one for each kind of text (`parquet_data.TEXTS`)."""
    if kind == "letters":
        return write_section(REPO / "docs" / "benchmark.md", START, END, "Parquet views", stamp, text)
    return write_section(REPO / "docs" / "benchmark.md", f"<!-- parquet-{kind}-bench:start -->",
                         f"<!-- parquet-{kind}-bench:end -->", f"Parquet views, text of {kind}", stamp, text)


def file_options(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The options of the sections that read the label-sorted file (this one, `parquet_cold`)."""
    ap.add_argument("--data", type=Path, required=True, help="where the file, the cache and the mount go")
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the file (2,000,000: about 1.05 GiB)")
    ap.add_argument("--group-rows", type=int, default=100_000)
    ap.add_argument("--text", choices=TEXTS, default="letters",
                    help="letters: random, incompressible; words: Zipf-drawn words, which snappy halves (parquet_data)")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--update-docs", action="store_true", help="write the section into docs/benchmark.md")


def stamp_of(section: str, args: argparse.Namespace) -> str:
    """The command and time a docs section names as its source."""
    text = f" --text {args.text}" if args.text != "letters" else ""
    return (f"python tools/bench.py --only {section} --data {args.data} --rows {args.rows}{text} --rounds {args.rounds} "
            f"--update-docs ({time.strftime('%Y-%m-%d %H:%M')})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    file_options(ap, rounds=3)
    ap.add_argument("--no-peers", action="store_true", help="leave out HF datasets")
    args = ap.parse_args(argv)
    text = run(args.data, args.rows, args.rounds, args.group_rows, not args.no_peers, args.text)
    print(text)
    if args.update_docs:
        print("wrote", update_docs(text, stamp_of("parquet", args), args.text))


if __name__ == "__main__":
    main()
