"""The "Peers" section of docs/benchmark.md: written between `START` and `END` by
``tools/bench.py --only peers --update-docs`` (a re-run replaces it; `bench.docs.update` keeps it when the main
benchmark rewrites the file).  Every figure and every comparison in the text comes from the run."""

from __future__ import annotations

import os
import platform
import re
import shlex
import time
from pathlib import Path

from . import peers_data, proc

START, END = "<!-- peers:start -->", "<!-- peers:end -->"
README_START, README_END = "<!-- peers-readme:start -->", "<!-- peers-readme:end -->"
GOOD_MIX = 1.5  # "mixes like a uniform shuffle": label mix within this factor of the uniform one


def _f(v, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None or v != v else fmt.format(v)


def _mem(res) -> str:
    peaks = res.out.get("memory", {})
    read = [peaks[p] for p in ("warm", "cold") if p in peaks]
    if not read:
        return "-"
    pss, anon = max(r[0] for r in read), max(r[1] for r in read)
    prep = peaks.get("prep", [0, 0])[0]
    return f"{pss / 2**20:,.0f} ({anon / 2**20:,.0f}) [{prep / 2**20:,.0f}]"


def _strategy(res) -> str:
    info = res.out.get("info") or {}
    if "strategy" not in info:
        return ""
    bs = info.get("block_size")
    bits = [f"`{info['strategy']}`"]
    if bs:
        bits.append(f"block {bs / 2**20:g} MiB" if bs >= 2**20 else f"block {bs / 1024:g} KiB")
    if info.get("buffer"):
        bits.append(f"buffer {info['buffer']}")
    if info.get("blocks_per_buffer"):
        bits.append(f"{info['blocks_per_buffer']} blocks/buffer")
    return ", ".join(bits)


def _row(res) -> str:
    name = res.spec.name
    if res.skipped:
        return f"| {name} | skipped: {res.skipped} |" + " |" * 7
    m = res.metrics
    cut = "" if res.out["warm"]["complete"] else "*"
    return (f"| {name} | {_strategy(res) or '-'} | {_f(res.rate('warm'))}{cut} | {_f(res.rate('cold'))} | "
            f"{res.prep_s:.1f} | {res.extra_disk / 1e6:,.0f} | {_mem(res)} | {m['mix']:.3f} | {m['entropy']:.2f} |")


def _ok(results) -> list:
    return [r for r in results if not r.skipped and r.out]


def _pick(results, pred):
    return [r for r in _ok(results) if pred(r)]


def findings(peers) -> list[str]:
    """What the numbers say, worded from them."""
    uni = peers.uniform["mix"]
    ok = _ok(peers.results)
    ours = [r for r in ok if r.spec.mount is not None]
    theirs = [r for r in ok if r.spec.mount is None]
    default = next((r for r in ours if r.spec.mount == [] and r.spec.key == "shufflefs-loop"), None)
    out = []
    if default is None or not theirs:
        return ["Not enough rows ran for a comparison."]
    w = default.rate("warm") or 0
    strat = (default.out.get("info") or {}).get("strategy", "?")
    fastest = max(theirs, key=lambda r: r.rate("warm") or 0)
    good = [r for r in theirs if r.metrics["mix"] <= GOOD_MIX * uni]
    best_mix = min(theirs, key=lambda r: r.metrics["mix"])
    out.append(f"- shufflefs with no shuffle options (strategy `{strat}` in this run) read {w:,.0f} samples/s warm "
               f"in a Python loop with a label mix of {default.metrics['mix']:.3f} (a uniform shuffle: {uni:.3f}, "
               f"{default.metrics['mix'] / uni:.1f}x).")
    out.append(f"- The fastest peer warm was {fastest.spec.name} at {fastest.rate('warm') or 0:,.0f} samples/s "
               f"({w / (fastest.rate('warm') or 1):.2f}x for shufflefs default), with a label mix of "
               f"{fastest.metrics['mix']:.3f} ({fastest.metrics['mix'] / uni:.1f}x uniform).")
    if good:
        g = max(good, key=lambda r: r.rate("warm") or 0)
        out.append(f"- Of the peers whose label mix came within {GOOD_MIX}x of uniform ({', '.join(r.spec.name for r in good)}), "
                   f"the fastest was {g.spec.name}: {g.rate('warm') or 0:,.0f} samples/s warm, "
                   f"{g.rate('cold') or 0:,.0f} cold, after {g.prep_s:.1f} s of preparation; shufflefs default "
                   f"read {w / (g.rate('warm') or 1):.2f}x its warm rate and "
                   f"{(default.rate('cold') or 0) / (g.rate('cold') or 1):.2f}x its cold rate.")
    else:
        out.append(f"- No peer's label mix came within {GOOD_MIX}x of uniform; the best was {best_mix.spec.name} "
                   f"({best_mix.metrics['mix']:.3f}).")
    poor = [r for r in theirs if r.metrics["mix"] > 3 * uni]
    if poor:
        out.append("- Peers whose label mix stayed above 3x uniform on this sorted data: "
                   + ", ".join(f"{r.spec.name} ({r.metrics['mix']:.3f})" for r in poor) + ".")
    for r in ours:
        if r is not default:
            out.append(f"- {r.spec.name}: {r.rate('warm') or 0:,.0f} samples/s warm, {r.rate('cold') or 0:,.0f} cold, "
                       f"label mix {r.metrics['mix']:.3f}.")
    sd = {r.spec.key: r for r in ok if r.spec.streaming}
    if "streaming-loader" in sd and "streaming-direct" in sd:
        a, b = sd["streaming-loader"], sd["streaming-direct"]
        out.append(f"- MosaicML Streaming through a DataLoader read {a.rate('warm') or 0:,.0f} samples/s warm; "
                   f"iterated directly, where every sample takes a cross-process file lock, "
                   f"{b.rate('warm') or 0:,.0f}.")
    return out


def section(peers, argv: list[str]) -> list[str]:
    a = peers.args
    u = peers.uniform
    cmd = "sudo .venv/bin/python tools/bench.py --only peers " + " ".join(shlex.quote(x) for x in argv)
    out = [START, "## Peers: shufflefs against the loaders people use", "",
           f"`{cmd.strip()}` on {time.strftime('%Y-%m-%d %H:%M')}: {proc.cpu_name()} ({os.cpu_count()} CPUs), "
           f"{proc.mem_gib():.0f} GiB RAM, Linux {platform.release()}. The run took {peers.seconds / 60:.1f} min; "
           f"load average at its end: {proc.loadavg()}.", "",
           f"Data: {peers.n:,} JSON lines of ~1 KB ({peers.data_bytes / 1e6:,.0f} MB), sorted by a `label` field "
           f"with {peers_data.LABELS} labels (`{{\"id\": i, \"label\": l, \"text\": ...}}`); the same records as "
           f"{len(peers.shards)} WebDataset tar shards of ~64 MB ({peers.tar_bytes / 1e6:,.0f} MB, written in "
           f"{peers.tar_s:.1f} s) for the tar readers. Every contender decodes each sample as the record "
           "(`json.loads` of the line, or the reader's own decoding into the same fields) and takes its label "
           "and id. Each runs in its own process, one after the other.", "",
           "| contender | shufflefs view | warm samples/s | cold samples/s | prep s | extra disk MB | "
           "peak MiB reading (anon) [prep] | label mix | gap entropy |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    out += [_row(r) for r in peers.results]
    out.append(f"| uniform shuffle (numpy permutation) | - | - | - | - | - | - | {u['mix']:.3f} | {u['entropy']:.2f} |")
    out += ["", f"Expected label mix of a uniform shuffle (exact, hypergeometric): {u['expected_mix']:.4f}.", "",
            "What the numbers say:", "", *findings(peers), "",
            "How it was measured:", "",
            f"- *warm*: epoch 1, after the contender's files (the source, or what it converted to) were read once, "
            f"so its data is in the page cache; read until {a.max_seconds:g} s had passed (or the epoch ended), "
            f"and on until {peers.upto:,} samples were read; samples/s over what was read (`*`: cut short). "
            f"*cold*: epoch 2 after `sync; echo 3 > /proc/sys/vm/drop_caches`, cut at {a.max_seconds:g} s"
            + ("" if peers.cold else " (not run)") + ".",
            "- *prep*: from the start of the contender's preparation (conversion, indexing, the mount) to its first "
            "batch of epoch 0; tar readers include writing the tar shards, and the second Streaming row the "
            "conversion it shares with the first.",
            "- *extra disk*: bytes the contender wrote beside the JSON lines (converted shards, Arrow cache, "
            "indexes; for the tar readers the tar shards).",
            "- *peak memory*: proportional set size (PSS, from /proc/PID/smaps_rollup every 0.1 s) summed over the "
            "process tree: the reading process, its DataLoader workers and, for shufflefs rows, the daemon; the "
            "largest sum while reading (warm and cold passes), its anonymous part in brackets, and the peak during "
            "preparation in square brackets. PSS counts the file pages a reader maps (Arrow and MDS files), "
            "split between the processes that map them.",
            f"- *label mix*: over the first {peers.upto:,} samples of the warm pass, the mean total-variation "
            f"distance between the label histogram of each {peers_data.MIX_WINDOW:,} consecutive samples and "
            "the whole set's (0: every stretch has the global mix; reading this sorted file in order scores "
            "0.9). *gap entropy*: MosaicML Streaming's measure, the entropy in bits of |id(i+1) - id(i)| over "
            "the same samples (`shufflefs.quality.gap_entropy`); both are compared with the uniform row, "
            "a numpy permutation's first samples of the same count.",
            f"- Equal memory: {64} MiB of records (~{peers.buffer_records:,} of these) wherever a contender has a "
            "sample buffer: shufflefs's `--buffer` default (64 MiB), the HF iterable and WebDataset shuffle "
            "buffers (split across their 2 DataLoader workers, each of which holds its own). `.shuffle()` of "
            "a map-style HF dataset, the pread Dataset, litdata and Streaming have no such buffer.", "",
            "Configurations:", ""]
    for r in peers.results:
        if r.skipped:
            out.append(f"- {r.spec.name}: skipped, {r.skipped}")
            continue
        mnt = "" if r.spec.mount is None else f"`shufflefs mount {' '.join(r.spec.mount) or '(no shuffle options)'}`"
        info = r.out.get("info") or {}
        extra = f" (view: {_strategy(r)}; expected label mix of its buffer {info['buffer_label_mix']})" \
            if info.get("buffer_label_mix") is not None else (f" (view: {_strategy(r)})" if mnt else "")
        note = f"; {r.out['notes']}" if r.out.get("notes") else ""
        out.append(f"- {r.spec.name}: {mnt + ', ' if mnt else ''}{r.out.get('config', '')}{extra}{note}.")
    out += ["", "litdata and MosaicML Streaming: litdata installs into the main venv (`pip install litdata`; "
            "its torchvision requirement was removed again, as that torchvision fails to load beside the CPU "
            "torch). Streaming runs in a venv of its own (`--streaming-venv`, made on first use), since it "
            "cannot be imported beside the main venv's `datasets`.", END]
    return out


def readme(peers) -> list[str]:
    """The README's table, between its markers: every contender that ran, warm samples/s and label mix."""
    rows = [f"| {r.spec.name} | {_f(r.rate('warm'))}{'' if r.out['warm']['complete'] else '*'} | "
            f"{r.metrics['mix']:.3f} |" for r in _ok(peers.results)]
    return [README_START,
            f"`sudo .venv/bin/python tools/bench.py --only peers --update-docs` (8-13 minutes) races the loaders on "
            f"{peers.n:,} JSON lines of ~1 KB sorted into {peers_data.LABELS} labels, run of {time.strftime('%Y-%m-%d')} "
            f"on {os.cpu_count()} CPUs; label mix is per 1,000 records, {peers.uniform['expected_mix']:.3f} for a "
            "uniform shuffle ([full table, memory and disk](docs/benchmark.md#peers-shufflefs-against-the-loaders-"
            "people-use)):", "", "| loader | warm samples/s | label mix |", "|---|---:|---:|", *rows, README_END]


def write(doc: Path, lines: list[str], start: str = START, end: str = END) -> Path:
    """Replace the section between ``start`` and ``end`` in ``doc`` (or append it)."""
    block = "\n".join(lines)
    body = doc.read_text() if doc.exists() else ""
    if start in body and end in body:
        body = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, body, flags=re.S)
    else:
        body = body.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(body)
    return doc
