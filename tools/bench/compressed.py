#!/usr/bin/env python3
"""Compressed text views against the loops users run over the compressed files themselves.

    python tools/bench.py --only compressed --data DIR [--gib 1.05] [--update-docs]

On a label-sorted JSON-lines corpus of at least 1 GiB decoded (generated into DIR once: word-like
text, about 3x compressible, as real corpora are), written as ``gzip -6`` writes it (one member),
as zstd frames of 1 MiB (pzstd, the seekable format) and as one zstd frame (the ``zstd`` command):

* the gzip restart-point libraries: indexed_gzip and rapidgzip, index build, index size, a random
  1 MiB read (restart points about every MiB for both);
* records/s of a plain ``gzip.open`` (or ``zstandard`` stream reader) line loop over the source
  and over the view at the same path through a mount with default options: the first epoch (the
  decoded copy written by the scan that indexed the file at its first lookup), warm (the epochs
  after it), the first epoch of a later mount (the index cached; the copy the mount before kept
  at its unmount, read warm and cold: the page cache dropped before each loop, the source's
  included; and without a kept copy: made in the background, or before the first byte for one
  zstd frame, with the machine's free page reporting as it is and held back, rounds alternated,
  since those rows write the copy into new pages: `page_reporting`), and the same warm epochs
  through a mount with ``--decoded-copies needed`` (decoded from restart points); the label mix
  per 100 records of what each loop got;
* time from an epoch change to the first record (a new open, ``readline``);
* the daemon's memory (own: anonymous + shared pages; RSS) against the bound;
* the CPU to write 1 GiB into new page-cache pages, right after memory was freed and after it sat free.

Prints a markdown section; ``--update-docs`` puts it in docs/benchmark.md between its markers.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .docs import write_section
from .page_reporting import KNOBS, freed_and_idle, in_turn, setting
from .page_reporting import settings as reporting_settings
from .proc import FuseDaemon, Sampler, can_drop_caches, drop_caches

REPO = Path(__file__).resolve().parents[2]
START, END = "<!-- compressed-bench:start -->", "<!-- compressed-bench:end -->"
LABELS = 10
GZ, FRAMES, ONE = "corpus.jsonl.gz", "frames.jsonl.zst", "one.jsonl.zst"
WARM_ROUNDS = 3
COLD_ROUNDS = 3
"""Warm epochs read, each right after a loop over the source: other work on the machine moves a
single pair's ratio by half of it (0.55-0.90 for the same gzip view in three runs)."""


# --------------------------------------------------------------------------- the corpus


def make_corpus(plain: Path, gib: float, seed: int = 0) -> None:
    """Label-sorted JSON lines of about 1 KB of word-like text (Zipf-distributed words)."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", np.uint8)
    vocab = [bytes(letters[np.minimum(rng.geometric(0.18, n) - 1, 25)]) for n in rng.integers(2, 10, 20000)]
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    p /= p.sum()
    target = int(gib * (1 << 30))
    n, i, written = target // 1000, 0, 0
    with open(plain, "wb") as f:
        while written < target:
            counts = rng.integers(60, 240, 8192)
            picks = rng.choice(len(vocab), int(counts.sum()), p=p)
            parts, pos = [], 0
            for j, k in enumerate(counts.tolist()):
                text = b" ".join(vocab[x] for x in picks[pos: pos + k])
                pos += k
                parts.append(b'{"id": %d, "label": %d, "text": "%s"}\n' % (i + j, min((i + j) * LABELS // n, 9), text))
            chunk = b"".join(parts)
            f.write(chunk)
            written += len(chunk)
            i += len(counts)


def corpus(data: Path, gib: float) -> Path:
    """DIR/src with the three compressed files (made once), and DIR/corpus.jsonl."""
    import zstandard

    src = data / "src"
    src.mkdir(parents=True, exist_ok=True)
    plain = data / "corpus.jsonl"
    if not plain.exists():
        make_corpus(plain, gib)
    if not (src / GZ).exists():
        subprocess.run(f"gzip -6 -c {plain} > {src / GZ}.tmp && mv {src / GZ}.tmp {src / GZ}", shell=True, check=True)
    if not (src / ONE).exists():
        subprocess.run(["zstd", "-q", "-3", "-f", "-o", str(src / ONE), str(plain)], check=True)
    if not (src / FRAMES).exists():
        c = zstandard.ZstdCompressor(level=3, write_checksum=True)
        with open(plain, "rb") as f, open(src / FRAMES, "wb") as out:
            while block := f.read(1 << 20):
                out.write(c.compress(block))
    return src


# --------------------------------------------------------------------------- loops


def line_loop(path: Path, limit: int | None = None) -> tuple[int, float, list[bytes], float]:
    """Records read by the usual loop, its seconds, the first 100,000 lines (for the mix), and
    the CPU seconds of the loop's process (the reader's share of the machine)."""
    import zstandard

    t0, c0 = time.perf_counter(), time.process_time()
    n, first = 0, []
    if path.name.endswith(".jsonl"):
        f = open(path, "rb")
    elif path.name.endswith(".gz"):
        f = gzip.open(path, "rb")
    else:
        f = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    with f:
        for line in f:
            if n < 100_000:
                first.append(line)
            n += 1
            if limit is not None and n >= limit:
                break
    return n, time.perf_counter() - t0, first, time.process_time() - c0


def label_mix(lines: list[bytes]) -> tuple[float, float]:
    from shufflefs.quality import expected_label_mix_tv, label_mix_tv

    labels = np.array([int(line.split(b'"label": ', 1)[1][:1]) for line in lines], np.int64)
    return (label_mix_tv(np.arange(len(labels)), labels, 100),
            expected_label_mix_tv(np.bincount(labels, minlength=LABELS), 100))


def first_record(mnt: Path, name: str, epoch: int) -> float:
    """Seconds from setting the epoch (on the mount) to the first record of a new open."""
    t0 = time.perf_counter()
    os.setxattr(mnt, "user.shufflefs.epoch", str(epoch).encode())
    if name.endswith(".jsonl"):
        with open(mnt / name, "rb") as f:
            f.readline()
    elif name.endswith(".gz"):
        with gzip.open(mnt / name, "rb") as f:
            f.readline()
    else:
        import zstandard

        with open(mnt / name, "rb") as raw:
            io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw)).readline()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- libraries


def libraries(path: Path, size: int) -> list[str]:
    """indexed_gzip against rapidgzip on the gzip corpus, restart points about every MiB."""
    rows = ["| library | index build s | restart points | index bytes | random 1 MiB read ms | MB/s of it |",
            "|---|---|---|---|---|---|"]
    rnd = random.Random(0)
    offsets = [rnd.randrange(size - (1 << 20)) for _ in range(48)]
    import rapidgzip

    try:
        import indexed_gzip  # a peer only: in no extra of shufflefs
    except ImportError:
        rows.append("| indexed_gzip (not installed here: `pip install indexed_gzip`) | - | - | - | - | - |")
    else:
        t0 = time.perf_counter()
        f = indexed_gzip.IndexedGzipFile(str(path), spacing=1 << 20, readbuf_size=1 << 20)
        f.build_full_index()
        build = time.perf_counter() - t0
        out = io.BytesIO()
        f.export_index(fileobj=out)
        points = sum(1 for _ in f.seek_points())
        t0 = time.perf_counter()
        for off in offsets:
            f.seek(off)
            f.read(1 << 20)
        per = (time.perf_counter() - t0) / len(offsets)
        f.close()
        rows.append(f"| indexed_gzip {indexed_gzip.__version__} (zlib) | {build:.1f} | {points} | "
                    f"{len(out.getvalue()):,} | {per * 1e3:.1f} | {(1 << 20) / per / 1e6:.0f} |")
    t0 = time.perf_counter()
    with rapidgzip.RapidgzipFile(str(path), parallelization=1, chunk_size=1 << 20) as g:
        while g.read(4 << 20):
            pass
        build = time.perf_counter() - t0
        out = io.BytesIO()
        g.export_index(out, rapidgzip.IndexFormat.GZTOOL)
        points = len(g.block_offsets())
    with rapidgzip.RapidgzipFile(str(path), parallelization=1, chunk_size=1 << 20) as g:
        g.import_index(io.BytesIO(out.getvalue()))
        t0 = time.perf_counter()
        for off in offsets:
            g.seek(off)
            g.read(1 << 20)
        per = (time.perf_counter() - t0) / len(offsets)
    rows.append(f"| rapidgzip {getattr(rapidgzip, '__version__', '')} (ISA-L, 1 thread) | {build:.1f} | {points} | "
                f"{len(out.getvalue()):,} | {per * 1e3:.1f} | {(1 << 20) / per / 1e6:.0f} |")
    return rows


# --------------------------------------------------------------------------- the run


def view_round(pid: int, view: Path, records: int, base: float, epoch: int) -> tuple:
    """One loop over ``view`` (its daemon ``pid`` sampled), after a source loop of rate ``base``:
    (epoch, view rate, base, daemon usage, mix, uniform, the reader's CPU seconds, the loop's
    seconds)."""
    with Sampler(pid) as s:
        n, t, got, cpu = line_loop(view)
    assert n == records, (view, n, records)
    return (epoch, n / t, base, s.usage, *label_mix(got), cpu, t)


def paired_rounds(pid: int, mnt: Path, name: str, source: Path, records: int, epochs: range
                  ) -> tuple[list[tuple], tuple[float, float]]:
    """Each epoch's `view_round` right after a loop over the source, and the source's own mix."""
    rounds, source_mix = [], (0.0, 0.0)
    for epoch in epochs:
        n, t, first, _ = line_loop(source)
        source_mix = label_mix(first)
        os.setxattr(mnt / name, "user.shufflefs.epoch", str(epoch).encode())
        rounds.append(view_round(pid, mnt / name, records, n / t, epoch))
    return rounds, source_mix


def cold_rounds(cmd: list[str], mnt: Path, name: str, source: Path, records: int, env: dict, log: Path,
                rounds: int = COLD_ROUNDS) -> list[tuple]:
    """Rounds of: the page cache dropped, a loop over the source; a later mount (which takes the
    copy the mount before kept), the page cache dropped, its first epoch's `view_round`."""
    got = []
    for _ in range(rounds):
        drop_caches()
        n, t, _, _ = line_loop(source)
        with FuseDaemon(cmd, mnt, log, env) as d:
            drop_caches()
            got.append(view_round(d.pid, mnt / name, records, n / t, 0))
    return got


def later_rounds(cmd: list[str], mnt: Path, name: str, source: Path, records: int, env: dict, log: Path,
                 drop_kept: Path | None = None, rounds: int = COLD_ROUNDS) -> tuple[list[tuple], bool]:
    """Rounds of: a loop over the source, then the first epoch of a later mount (warm), as
    `paired_rounds`; each mount takes the copy the one before kept, or, with ``drop_kept`` (the
    cache directory), finds none: its kept copies are removed before each mount and after the
    last, as on a node that never read the file.  And whether every mount took a kept copy."""
    got, taken = [], True
    for _ in range(rounds):
        if drop_kept is not None:
            shutil.rmtree(drop_kept / "kept-copies", ignore_errors=True)
        with FuseDaemon(cmd, mnt, log, env) as d:
            got += paired_rounds(d.pid, mnt, name, source, records, range(1))[0]
            made = json.loads(os.getxattr(mnt, "user.shufflefs.stats")).get("decoded_copies", {})
        taken &= any(c.get("made", "").startswith("by an earlier mount") for c in made.values())
    if drop_kept is not None:
        shutil.rmtree(drop_kept / "kept-copies", ignore_errors=True)
    return got, taken


def round_rows(name: str, groups: tuple) -> list[str]:
    """Table rows of groups of rounds: the median round's rate and ratio (the range of the ratios),
    its daemon's and reader's CPU and the CPUs they kept busy on average, the peak memory of all
    of them."""
    rows = []
    for what, got in groups:
        ratios = [r[1] / r[2] for r in got]
        k = int(np.argsort(ratios)[len(ratios) // 2])  # the median round
        _, rate, _, u, mix, uniform, cpu, seconds = got[k]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(got) > 1 else ""
        rows.append(f"| {name} | {what} | {rate:,.0f} | {ratios[k]:.2f}{spread} | {mix:.3f} ({uniform:.3f}) | "
                    f"{u.cpu_s:.1f} | {cpu:.1f} | {(u.cpu_s + cpu) / seconds:.2f} | "
                    f"{max(r[3].peak_own for r in got) / 2**20:.0f} / "
                    f"{max(r[3].peak_rss for r in got) / 2**20:.0f} |")
    return rows


def wait_for_copy(mnt: Path, name: str, timeout: float = 600.0) -> float:
    """Seconds until the view's decoded copy, started by its first open, is made."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        got = json.loads(os.getxattr(mnt / name, "user.shufflefs.info")).get("compressed", {})
        if got.get("read_from") == "a decoded copy" or "none" in got.get("decoded_copy", ""):
            break
        time.sleep(0.2)
    return time.perf_counter() - t0


def run(data: Path, gib: float, skip_libraries: bool, files: list[str] | None = None) -> str:
    src = corpus(data, gib)
    plain = data / "corpus.jsonl"
    size = plain.stat().st_size
    records = sum(1 for _ in open(plain, "rb"))
    out = [f"Corpus: {size / 2**30:.2f} GiB decoded, {records:,} JSON lines sorted by label (10 labels), "
           f"{(src / GZ).stat().st_size / 2**20:.0f} MiB as gzip -6 (one member), "
           f"{(src / FRAMES).stat().st_size / 2**20:.0f} MiB as zstd frames of 1 MiB, "
           f"{(src / ONE).stat().st_size / 2**20:.0f} MiB as one zstd frame. Machine: {os.cpu_count()} CPUs. "
           f"Load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.", ""]
    if not skip_libraries:
        out += ["Restart points of gzip (the index a view reads the source through):", ""]
        out += libraries(src / GZ, size) + [""]
    mnt = data / "mnt"
    mnt.mkdir(exist_ok=True)
    cache = data / "cache"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    plain_src = data / "plain-src"  # the decoded corpus, for the plain view's row
    plain_src.mkdir(exist_ok=True)
    if not (plain_src / "corpus.jsonl").exists():
        os.link(plain, plain_src / "corpus.jsonl")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rows = ["| file | read | records/s | x source | label mix /100 (uniform) | daemon CPU s | reader CPU s | "
            "CPUs busy | daemon own / RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    firsts, builds = [], []
    bound = 16 * records + 100 * 2**20
    stats: dict = {}
    knob_path, reporting = reporting_settings()
    for name in files or ("corpus.jsonl", GZ, FRAMES, ONE):  # a daemon of its own for each: memory apart
        where = plain_src if name == "corpus.jsonl" else src
        cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(where), str(mnt), "--cache-dir", str(cache)]
        source = where / name  # python's line loop over the plain file, else the decompressing one
        background = name in (GZ, FRAMES)  # read from restart points until their copy is made
        with FuseDaemon(cmd, mnt, data / "daemon.log", env) as d:
            if name != "corpus.jsonl":
                line_loop(source)  # warms the page cache
            t0 = time.perf_counter()
            view_size = os.stat(mnt / name).st_size  # indexes the file (decodes it once)
            builds.append((name, time.perf_counter() - t0, view_size))
            rounds, source_mix = paired_rounds(d.pid, mnt, name, source, records, range(1))
            wait = wait_for_copy(mnt, name) if background else None
            rounds += paired_rounds(d.pid, mnt, name, source, records, range(1, 1 + WARM_ROUNDS))[0]
            info = json.loads(os.getxattr(mnt / name, "user.shufflefs.info"))
            window = int(info["buffer_bytes"])
            times = [first_record(mnt, name, e) for e in range(WARM_ROUNDS + 1, WARM_ROUNDS + 4)]
            read_from = info.get("compressed", {}).get("read_from", "the file")
            firsts.append((name, info["block_size"], read_from, sorted(times)[1], window))
            if name == ONE or (background and not stats):
                stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        bases = [r[2] for r in rounds]
        rows.append(f"| {name} | source loop | {np.median(bases):,.0f} ({min(bases):,.0f}-{max(bases):,.0f}) | 1.00 | "
                    f"{source_mix[0]:.3f} ({source_mix[1]:.3f}) | - | - | - | - |")
        warm = f"view, warm (median of {WARM_ROUNDS}" + (f"; the copy made {wait:.0f} s after the first epoch)"
                                                        if wait is not None and wait >= 0.5 else ")")
        rows += round_rows(name, (("view, first epoch", rounds[:1]), (warm, rounds[1:])))
        if name != "corpus.jsonl" and can_drop_caches():  # cold: the kept copy read from disk
            rows += round_rows(name, ((f"view, first epoch of a later mount, cold (the page cache dropped before "
                                       f"it and before the source loop it is paired with; the kept copy read from "
                                       f"disk; median of {COLD_ROUNDS})",
                                       cold_rounds(cmd, mnt, name, source, records, env, data / "daemon.log")),))
        if name != "corpus.jsonl":  # later mounts: the index cached, so no scan writes the copy
            kept, taken = later_rounds(cmd, mnt, name, source, records, env, data / "daemon.log")
            how = "made in the background meanwhile" if background else "made at its first open"
            rows += round_rows(name, ((f"view, first epoch of a later mount (index cached; "
                                       f"{'the copy the mount before kept' if taken else 'NO KEPT COPY FOUND'}; "
                                       f"median of {COLD_ROUNDS})", kept),))
            later: dict[str, list[tuple]] = {what: [] for what, _ in reporting}
            for r in range(COLD_ROUNDS):  # the settings alternated round by round
                for what, value in in_turn(reporting, r):
                    with setting(knob_path, value):
                        later[what] += later_rounds(cmd, mnt, name, source, records, env, data / "daemon.log",
                                                    cache, rounds=1)[0]
            rows += round_rows(name, tuple((f"view, first epoch of a later mount, no kept copy (index cached: the "
                                            f"copy {how}; free page reporting {what}; median of {COLD_ROUNDS})", got)
                                           for what, got in later.items()))
        if background:  # the same warm epochs decoded from restart points, as without a copy
            with FuseDaemon(cmd + ["--decoded-copies", "needed"], mnt, data / "daemon.log", env) as d:
                again = paired_rounds(d.pid, mnt, name, source, records, range(1, 1 + WARM_ROUNDS))[0]
            rows += round_rows(name, ((f"view, warm, `--decoded-copies needed` (median of {WARM_ROUNDS})", again),))
    out += ["Line loops over the source and over the view at the same path (default mount options, so "
            "`stratified` with a 64 MiB buffer; warm: the source in the page cache, the index cached; a daemon "
            "of its own per file; the first row is the plain corpus read by Python's line loop, for reference). "
            "Every view loop runs right after a loop over the source, and its ratio is to that loop; the source "
            "row gives the median (range) of those loops, the warm row the median round (the range of its "
            "ratios), the CPU seconds of its daemon and of its reader (the loop's own process) and the CPUs "
            f"the two kept busy on average over the loop (of the machine's {os.cpu_count()}), and the peak memory "
            "of all of them:",
            ""]
    out += rows + [""]
    out += ["| file | index at first lookup s | view bytes (x decoded) | block | read from | epoch change -> first "
            "record ms (median of 3) |", "|---|---|---|---|---|---|"]
    for (name, built, view_size), (_, block, read_from, first, _) in zip(builds, firsts):
        out.append(f"| {name} | {built:.1f} | {view_size:,} ({view_size / size:.4f}) | {block >> 10} KiB | "
                   f"{read_from} | {first * 1e3:.0f} |")
    out += ["", f"Daemon memory bound (16 bytes/record + 3 windows + 100 MiB): {(bound + 3 * window) / 2**20:.0f} MiB. "
            f"Decoded copies: {stats.get('decoded', {}).get('files', 0)} "
            f"({stats.get('decoded', {}).get('bytes', 0) / 2**30:.2f} GiB under {stats.get('decoded', {}).get('dir')}).",
            "", f"Rows that decode from restart points (no copy yet, `needed`) hold the file's decoders besides: gzip "
            f"one, its restart points (about 10 MB per GiB decoded) and rapidgzip's chunk cache (about 21 MB); zstd "
            f"two decoded frames (`sources.decoded.DECODERS`) and up to 4 MiB of frame starts (`formats.zstd_decode."
            f"HEADS_MOST`). For this gzip file that is a bound of "
            f"{(bound + 3 * window + 10e6 * size / 2**30 + 21e6) / 2**20:.0f} MiB. A gzip file's copy made in the "
            f"background is decoded by a child process (`stages.copy_process`), whose memory is its own; a zstd "
            f"file's is written from the frames its views decode (`stages.frame_fill`)."]
    freed, idled = freed_and_idle(data)
    out += ["", "The rows without a kept copy write the copy (1.06 GiB) into new page-cache pages while the view is "
            "read. On a virtual machine that reports its free memory to its host (free page reporting: "
            + (f"{KNOBS}, `{knob_path.name}` {knob_path.read_text().strip()} as the machine has it" if knob_path
               else "no setting this process may write here") + "), memory left free a few seconds is taken back "
            "and faulted in anew on its next write. CPU seconds to write 1 GiB into a new file by 1 MiB `pwrite`s "
            "(`page_reporting.freed_and_idle`, 3 rounds): "
            f"right after 1 GiB was freed {', '.join(f'{c:.2f}' for c in freed)}; after the freed memory sat 8 s "
            f"{', '.join(f'{c:.2f}' for c in idled)}."]
    return "\n".join(out)


def update_docs(text: str, stamp: str) -> Path:
    return write_section(REPO / "docs" / "benchmark.md", START, END, "Compressed text views", stamp, text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="where the corpus and the mount go")
    ap.add_argument("--gib", type=float, default=1.05, help="decoded size of the corpus to generate")
    ap.add_argument("--skip-libraries", action="store_true", help="leave out indexed_gzip against rapidgzip")
    ap.add_argument("--update-docs", action="store_true", help="write the section into docs/benchmark.md")
    ap.add_argument("--files", nargs="+", choices=("corpus.jsonl", GZ, FRAMES, ONE),
                    help="measure these views only (default: all four)")
    args = ap.parse_args(argv)
    if args.update_docs and args.files:
        ap.error("--update-docs measures every view: leave out --files")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # free page reporting is restored on the way out
    text = run(args.data, args.gib, args.skip_libraries, args.files)
    print(text)
    if args.update_docs:
        stamp = f"python tools/bench.py --only compressed --data {args.data} --update-docs ({time.strftime('%Y-%m-%d %H:%M')})"
        print("wrote", update_docs(text, stamp))


if __name__ == "__main__":
    main()
