#!/usr/bin/env python3
"""shufflefs against its baselines and the user-space alternatives, in one run on one machine.

    python tools/bench.py [--size 2GiB] [--quick] [--out results.md] [--only views,torch,...]
    python tools/bench.py --only SECTION [its own options]     (a section that runs alone)

Generates (or takes, ``--data DIR``) two datasets, JSON Lines of ~1 KiB records and fixed-size
3 KiB records, then measures side by side:

  raw          sequential read of the source files
  passthrough  a C libfuse passthrough of the same files (compiled here; direct_io and page cache)
  views        every strategy's view, read with 1 MiB reads, 128 KiB reads (cat's size) and a
               Python loop over records
  paired       the speed targets' measurements: contenders mounted at once and read in rotating
               order for several rounds (median of per-round ratios), first pass vs later passes
               on fresh mounts, and a dataset larger than memory (a memory cgroup; see paired.py)
  serving      the default serving (page cache, shared mappings work) against --direct-io, none
               and corgipile warm, in paired rounds (see serving.py)
  torch        a PyTorch map-style Dataset + RandomSampler, one pread per record (DataLoader)
  streaming    MosaicML Streaming: MDS conversion, then a local StreamingDataset epoch (py1e)
  once-copy    Shuffle Once: a shuffled copy written once, then read front to back
  index        index build rate of newline scanning
  remount      mount -> first byte with a cached index of many records
  epoch        epoch change -> first byte of a corgipile view
  s3           views of a bucket on a local S3 server: bytes and GET requests per epoch of
               none, corgipile and full, first byte, corgipile by requests in flight

Sections that run alone (their own data and options; ``--only NAME --help`` lists them) are
listed at the end of ``--help``.

Each read is done warm (source in the page cache) and cold (after dropping caches; needs root).
Mounting needs root or FUSE permissions; the passthrough needs gcc and libfuse3-dev; the
alternatives need torch and mosaicml-streaming (rows say "skipped" where one is missing).  The
latter's declared requirements would replace numpy and the CPU build of torch, so install it as

    pip install --no-deps mosaicml-streaming
    pip install brotli catalogue python-snappy xxhash zstd filelock tqdm 'transformers<5'

Reads that would take longer than ``--max-seconds`` stop there and their epoch time is
extrapolated from the rate (marked ``~``).  Every ratio is against a baseline measured in this
run.  Mounts are unmounted and daemons ended by PID in ``finally`` blocks; the temporary
directory is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path[:0] = [str(TOOLS), str(REPO)]

from bench import alternatives, data, proc, reads, sections, timings  # noqa: E402
from bench.paired import Paired  # noqa: E402
from bench.serving import Serving  # noqa: E402
from bench.reads import Reading  # noqa: E402
from bench.report import MiB, Report, Row  # noqa: E402
from bench.targets import targets  # noqa: E402
from shufflefs.config import parse_size  # noqa: E402
from shufflefs.cli.mount import daemon_python  # noqa: E402
from shufflefs.fs.daemon import raise_readahead  # noqa: E402
from shufflefs.formats import load_or_build_index, make_format  # noqa: E402
from shufflefs.index.table import IndexCache, RecordIndex  # noqa: E402
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan  # noqa: E402

STRATEGY_ORDER = ("none", "stratified", "corgipile", "block", "full", "lirs-page", "window", "once")
SECTIONS = ("raw", "passthrough", "views", "paired", "serving", "torch", "streaming", "once-copy", "index", "remount", "epoch", "s3")
DATASETS = ("lines", "fixed")
PT_MODES = ("direct_io", "page cache")
RAW = "raw source"
FIRST = "warm, 1st"
EPOCH_ATTR = "user.shufflefs.epoch"


def pt_name(mode: str) -> str:
    return f"C passthrough ({mode})"


def view_name(strategy: str) -> str:
    return f"view {strategy}"


@dataclass
class Dataset:
    name: str
    path: Path
    record_size: int | None
    index: RecordIndex

    @property
    def size(self) -> int:
        return self.index.size

    @property
    def n(self) -> int:
        return self.index.n

    def row(self, what: str, reader: str, cache: str, **kw) -> Row:
        return Row(self.name, what, reader, cache, file_bytes=self.size, file_records=self.n, **kw)


def _csv(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad:
        raise SystemExit(f"bench: unknown {what} {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.report = Report()
        self.cold = not args.no_cold and proc.can_drop_caches()
        self.caches = ("warm", "cold") if self.cold else ("warm",)
        self.readers = _csv(args.readers, reads.READERS, "reader")
        self.strategies = _csv(args.strategies, tuple(STRATEGIES), "strategy")
        self.only = set(_csv(args.only, SECTIONS, "section")) if args.only else set(SECTIONS)
        self.cache_dir = work / "cache"
        self.logs = work / "logs"
        for d in (self.cache_dir, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.epoch = 0
        self.datasets: list[Dataset] = []
        self.src: Path = work / "src"
        self.started = time.perf_counter()
        self.index_gbps: float | None = None  # results that the targets table reads
        self.remount_s: float | None = None
        self.epoch_first_s: float | None = None
        self.resume_first_s: tuple[float, float] | None = None
        self.paired: Paired | None = None
        self.serving: Serving | None = None

    # ------------------------------------------------------------------ helpers

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)

    def measure(self, row: Row, fn: Callable[[], Reading], pid: int | None = None,
                warm: tuple[Path, ...] = ()) -> Row:
        """Run one read in the row's cache state, bracketed by the daemon's CPU and peak RSS."""
        if row.cache == "cold":
            proc.drop_caches()
        else:
            for p in warm:
                reads.warm(p)
        with proc.Sampler(pid) as s:
            row.reading = fn()
        if s.usage is not None:
            row.cpu_s, row.rss, row.own = s.usage.cpu_s, s.usage.peak_rss, s.usage.peak_own
            if s.usage.peak_since_start:
                row.note = "peak RSS since daemon start"
        self.report.add(row)
        gbps = row.gbps or 0.0
        mark = "" if row.reading.complete else " (cut short)"
        self.say(f"{row.dataset:6} {row.what:28} {row.reader:7} {row.cache:5} {gbps:7.3f} GB/s "
                 f"{row.records_per_s or 0:12,.0f} rec/s{mark}")
        return row

    def skip(self, ds: Dataset | str, what: str, reader: str, cache: str, why: str) -> None:
        name = ds.name if isinstance(ds, Dataset) else ds
        self.report.add(Row(name, what, reader, cache, skipped=why))

    def shufflefs_cmd(self, src: Path, mnt: Path, strategy: str, *extra: str) -> list[str]:
        return [*daemon_python(), "mount", "-f", str(src), str(mnt), "--cache-dir", str(self.cache_dir),
                "--strategy", strategy, "--block-size", self.args.block_size, "--buffer", self.args.buffer,
                "--record-size", str(data.FIXED_RECORD), *extra, *shlex.split(self.args.mount_args)]

    def spec(self, strategy: str) -> ShuffleSpec:
        buffer = self.args.buffer
        buf = float(buffer.strip()[:-1]) / 100 if buffer.strip().endswith("%") else parse_size(buffer)
        block = None if self.args.block_size == "auto" else parse_size(self.args.block_size)
        return ShuffleSpec(strategy=strategy, seed=0, block_size=block, buffer=buf)

    def next_epoch(self, mnt: Path) -> None:
        """A fresh epoch for every pass: new view inodes, so no pass is served from an earlier one's pages."""
        self.epoch += 1
        os.setxattr(mnt, EPOCH_ATTR, str(self.epoch).encode())

    # ------------------------------------------------------------------ datasets

    def prepare(self) -> None:
        size = parse_size(self.args.size)
        if self.args.data:
            self.src = Path(self.args.data).resolve()
            self.src.mkdir(parents=True, exist_ok=True)
        else:
            self.src = self.work / "src"
            self.src.mkdir(exist_ok=True)
        self.src = Path(os.path.realpath(self.src))
        cache = IndexCache(self.cache_dir)
        for name in _csv(self.args.datasets, DATASETS, "dataset"):
            if name == "lines":
                path, record_size, fmt = self.src / data.LINES_NAME, None, make_format("lines")
                made = data.ensure(path, data.make_lines, size, self.args.seed)
            else:
                path, record_size = self.src / data.FIXED_NAME, data.FIXED_RECORD
                fmt = make_format("fixed", {"record_size": record_size})
                made = data.ensure(path, data.make_fixed, size, record_size, self.args.seed)
            index = load_or_build_index(str(path), fmt, cache)
            ds = Dataset(name, path, record_size, index)
            self.datasets.append(ds)
            self.say(f"dataset {name}: {path} ({ds.size / 1e6:.0f} MB, {ds.n:,} records, "
                     f"{'generated' if made else 'taken as is'})")

    # ------------------------------------------------------------------ sections

    def run_raw(self) -> None:
        for ds in self.datasets:
            for rd in self.readers:
                fn = reads.reader(rd, ds.record_size)
                for cache in self.caches:
                    self.measure(ds.row(RAW, rd, cache), lambda: fn(ds.path, self.args.max_seconds), warm=(ds.path,))

    def build_passthrough(self) -> tuple[Path | None, str]:
        if shutil.which("gcc") is None or shutil.which("pkg-config") is None:
            return None, "gcc or pkg-config missing"
        flags = subprocess.run(["pkg-config", "fuse3", "--cflags", "--libs"], capture_output=True, text=True)
        if flags.returncode != 0:
            return None, "libfuse3-dev missing (pkg-config fuse3 failed)"
        out = self.work / "passthrough"
        cc = subprocess.run(["gcc", "-O2", "-o", str(out), str(TOOLS / "bench" / "passthrough.c"), *flags.stdout.split()],
                            capture_output=True, text=True)
        if cc.returncode != 0:
            return None, "compile failed: " + cc.stderr.strip()[-300:]
        return out, ""

    def run_passthrough(self) -> None:
        binary, why = self.build_passthrough()
        mnt = self.work / "mnt-pt"
        mnt.mkdir(exist_ok=True)
        for mode in PT_MODES:
            what = pt_name(mode)
            if binary is None:
                for ds in self.datasets:
                    for rd in self.readers:
                        for cache in self.caches:
                            self.skip(ds, what, rd, cache, why)
                continue
            cmd = [str(binary), str(self.src), str(mnt), "-f", "-o", "ro,default_permissions"]
            if mode == "direct_io":
                cmd.insert(3, "--direct-io")
            with proc.FuseDaemon(cmd, mnt, self.logs / "passthrough.log") as d:
                raise_readahead(str(mnt))  # the 1 MiB readahead shufflefs mounts get (page-cache mode)
                for ds in self.datasets:
                    target = mnt / ds.path.name
                    for rd in self.readers:
                        fn = reads.reader(rd, ds.record_size)
                        for cache in self.caches:
                            self.measure(ds.row(what, rd, cache), lambda: fn(target, self.args.max_seconds),
                                         pid=d.pid, warm=(ds.path,))

    def run_views(self) -> None:
        mnt = self.work / "mnt"
        mnt.mkdir(exist_ok=True)
        memory = ["| strategy | dataset | records | largest window MiB | bound MiB (16 B/record + 3 windows + 100 MiB) "
                  "| peak RSS MiB | peak own MiB | own / bound |", "|---|---|---|---|---|---|---|---|"]
        for strategy in self.strategies:
            cmd = self.shufflefs_cmd(self.src, mnt, strategy, "--log-file", str(self.logs / f"{strategy}.log"))
            with proc.FuseDaemon(cmd, mnt, self.logs / f"{strategy}.out", env=self.env) as d:
                firsts = {}
                for ds in self.datasets:
                    # The first pass after mounting loads the index from its cache and touches the
                    # window buffers for the first time; it is shown, and kept out of the ratios.
                    self.next_epoch(mnt)
                    fn = reads.reader("1MiB", ds.record_size)
                    firsts[ds.name] = self.measure(ds.row(view_name(strategy), "1MiB", FIRST),
                                                   lambda: fn(mnt / ds.path.name, self.args.max_seconds),
                                                   pid=d.pid, warm=(ds.path,))
                for ds in self.datasets:
                    target = mnt / ds.path.name
                    rows = [firsts[ds.name]]
                    for rd in self.readers:
                        fn = reads.reader(rd, ds.record_size)
                        for cache in self.caches:
                            self.next_epoch(mnt)
                            rows.append(self.measure(ds.row(view_name(strategy), rd, cache),
                                                     lambda: fn(target, self.args.max_seconds), pid=d.pid, warm=(ds.path,)))
                    memory.append(self._memory_line(strategy, ds, rows))
        self.report.section("Daemon memory against 16 bytes/record + 3 windows + 100 MiB", memory)

    def run_paired(self) -> None:
        self.paired = Paired(self, self.args.rounds)
        self.paired.run()
        self.report.section("Paired rounds (what the speed targets are judged on)", self.paired.lines)

    def run_serving(self) -> None:
        self.serving = Serving(self, self.args.rounds)
        self.serving.run()
        self.report.section("Serving modes: page cache (default) against --direct-io", self.serving.lines)

    def _memory_line(self, strategy: str, ds: Dataset, rows: list[Row]) -> str:
        sizes = make_plan(ds.index, self.spec(strategy), 0).window_sizes
        window = int(max(sizes)) if len(sizes) else 0
        bound = 16 * ds.n + 3 * window + 100 * MiB
        peak = max((r.rss for r in rows if r.rss is not None), default=None)
        own = max((r.own for r in rows if r.own is not None), default=None)
        ratio = f"{own / bound:.2f}" if own else "-"
        peak_s = f"{peak / MiB:.0f}" if peak else "-"
        own_s = f"{own / MiB:.0f}" if own else "-"
        return (f"| {strategy} | {ds.name} | {ds.n:,} | {window / MiB:.1f} | {bound / MiB:.0f} | {peak_s} | {own_s} | "
                f"{ratio} |")

    def run_torch(self) -> None:
        alternatives.run_torch(self)

    def run_streaming(self) -> None:
        alternatives.run_streaming(self)

    def run_once_copy(self) -> None:
        alternatives.run_once_copy(self)

    def run_index(self) -> None:
        timings.run_index(self)

    def run_remount(self) -> None:
        timings.run_remount(self)

    def run_epoch(self) -> None:
        timings.run_epoch(self)

    # ------------------------------------------------------------------ ratios and targets

    def run_s3(self) -> None:
        from bench.objstore import ObjectBench

        section = ObjectBench(self, parse_size(self.args.s3_size))
        section.run()
        self.report.section("Object storage (a local S3 server)", section.lines)

    def finish(self) -> None:
        rep = self.report
        for row in rep.rows:
            if row.skipped or row.reading is None or row.cache == FIRST:
                continue
            ds, rd, cache = row.dataset, row.reader, row.cache
            if row.what.startswith("C passthrough"):
                rep.compare(row, rep.find(ds, RAW, rd, cache), f"raw {rd} {cache}")
            elif row.what.startswith("view "):
                if cache == "warm":
                    mode = self.view_mode(ds)
                    rep.compare(row, rep.find(ds, pt_name(mode), rd, cache), f"passthrough {mode} {rd}")
                else:
                    rep.compare(row, rep.find(ds, RAW, rd, cache), f"raw {rd} {cache}")
                none = rep.find(ds, view_name("none"), rd, cache)
                if none is not None and none.gbps:
                    row.ratio_none = row.gbps / none.gbps
            elif row.what != RAW:
                same = rd if rd in reads.READERS else "loop"
                base = rep.find(ds, view_name("corgipile"), same, cache)
                rep.compare(row, base, f"corgipile {same} {cache}", by="records_per_s")
        rep.section("Targets", targets(self))

    def view_mode(self, ds: str) -> str:
        """How the views of dataset ``ds`` are served: the passthrough mode they compare with."""
        return "direct_io" if ds != "fixed" and "--direct-io" in shlex.split(self.args.mount_args) else "page cache"

    # ------------------------------------------------------------------ run

    def run(self) -> Report:
        self.prepare()
        self.report.header = self.header()
        steps = [("raw", self.run_raw), ("passthrough", self.run_passthrough), ("views", self.run_views),
                 ("paired", self.run_paired), ("serving", self.run_serving),
                 ("torch", self.run_torch), ("streaming", self.run_streaming), ("once-copy", self.run_once_copy),
                 ("index", self.run_index), ("remount", self.run_remount), ("epoch", self.run_epoch),
                 ("s3", self.run_s3)]
        for name, step in steps:
            if name in self.only:
                self.say(f"--- {name}")
                step()
        self.finish()
        self.report.header += ["", f"Run took {time.perf_counter() - self.started:.0f} s; load average at the "
                                   f"end: {proc.loadavg()}."]
        return self.report

    def header(self) -> list[str]:
        a = self.args
        versions = []
        for mod in ("numpy", "torch", "streaming", "pyfuse3", "trio"):
            try:
                m = __import__(mod) if mod != "streaming" else alternatives.import_streaming()
                versions.append(f"{mod} {getattr(m, '__version__', '?')}")
            except Exception:  # noqa: BLE001 -- a version line only
                pass
        cmd = "python tools/bench.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
        sizes = ", ".join(f"{d.name} {d.size / 1e6:.0f} MB / {d.n:,} records" for d in self.datasets)
        return [
            "## shufflefs benchmark", "",
            f"`{cmd}` on {time.strftime('%Y-%m-%d %H:%M')}: {proc.cpu_name()} ({os.cpu_count()} CPUs), "
            f"{proc.mem_gib():.0f} GiB RAM, Linux {platform.release()}, Python {platform.python_version()}, "
            + ", ".join(versions) + ".",
            "",
            f"Datasets: {sizes}. Mounts: `--block-size {a.block_size} --buffer {a.buffer}` "
            f"{a.mount_args}. Reads stop after {a.max_seconds:g} s (epoch then extrapolated, `~`). "
            f"Cold = after `echo 3 > /proc/sys/vm/drop_caches`{'' if self.cold else ' (not run: needs root, or --no-cold)'}. "
            f"Load average at the start: {proc.loadavg()}.",
            "",
            "Columns: `x base` is this row's rate over the baseline named in `base` (same dataset, reader and "
            "cache state; for alternatives, records/s over the corgipile view read the same way, or by the "
            "Python loop where the alternative has its own reader); `x none` "
            "is the rate over the `none` view's. Views go through the page cache (so shared `mmap` works) and "
            "are compared warm with the passthrough in page-cache mode (with `--direct-io` in `--mount-args`, "
            "views of lines use direct_io and are compared with the passthrough in direct_io mode). Cold views are compared with the cold raw "
            "read. `warm, 1st`: a view's first pass after mounting (index loaded from its cache, window buffers "
            "touched for the first time), not used in ratios. The Python loop reads `st_blksize` bytes at a "
            "time: 4 KiB from the source and the passthrough, 1 MiB from views (shufflefs sets it). "
            "`first ms`: open (or DataLoader / StreamingDataset creation) to the first record, plus "
            "conversion or rewrite where counted. Daemon CPU from /proc/PID/stat; daemon memory as `own / RSS`: "
            "own = the largest RssAnon + RssShmem sampled every 5 ms (the daemon's memory, what the bound "
            "limits), RSS = VmHWM (reset before each row), which also counts the pages of source files that "
            "record-level views copy from a mapping (page cache shared with every reader of those files).",
        ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="sections that run alone (--only NAME [its options]; --only NAME --help):\n"
                                 + "\n".join(sections.describe()))
    ap.add_argument("--size", help="bytes per dataset (default 2GiB; 256MiB with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="a short run: 256MiB datasets, reads cut after 5 s, 1M records for the remount test")
    ap.add_argument("--out", type=Path, help="also write the markdown report here")
    ap.add_argument("--only", default="", help=f"comma-separated sections (default all: {','.join(SECTIONS)}), "
                    "or one section that runs alone (listed below)")
    ap.add_argument("--data", help="take (or generate once and keep) the datasets in this directory; "
                    f"it should hold {data.LINES_NAME} and/or {data.FIXED_NAME}")
    ap.add_argument("--tmp", help="where the temporary work directory is created (default: the system's)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    ap.add_argument("--no-cold", action="store_true", help="skip cold-cache runs (they drop the page cache)")
    ap.add_argument("--max-seconds", type=float, help="cut each read after this many seconds (default 20; 5 with --quick)")
    ap.add_argument("--strategies", default=",".join(STRATEGY_ORDER))
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--readers", default=",".join(reads.READERS))
    ap.add_argument("--workers", default="0,2", help="DataLoader workers for the pread Dataset (default 0,2)")
    ap.add_argument("--block-size", default="auto", help="--block-size of every mount (default auto: the mounts' own)")
    ap.add_argument("--buffer", default="64MiB")
    ap.add_argument("--mount-args", default="", help="extra `shufflefs mount` options, quoted as one argument")
    ap.add_argument("--remount-records", help="records of the remount test (default 10M; 1M with --quick)")
    ap.add_argument("--epochs", type=int, default=5, help="epoch changes timed per kind (default 5)")
    ap.add_argument("--rounds", type=int, help="rounds of the paired section (default 5; 2 with --quick)")
    ap.add_argument("--s3-size", help="bytes uploaded for the object-storage section (default 256MiB; 64MiB with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--update-docs", action="store_true",
                    help="a full run (no --quick, --only or --size): rewrite docs/benchmark.md and the excerpts in docs/performance.md and docs/guide/object-storage.md")
    args = ap.parse_args(argv)
    if args.update_docs and (args.quick or args.only or args.size or args.no_cold):
        ap.error("--update-docs records a full run: drop --quick, --only, --size and --no-cold")
    args.size = args.size or ("256MiB" if args.quick else "2GiB")
    args.max_seconds = args.max_seconds or (5.0 if args.quick else 20.0)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.s3_size = args.s3_size or ("64MiB" if args.quick else "256MiB")
    args.remount_records = args.remount_records or ("1M" if args.quick else "10M")
    return args


def main(argv: list[str] | None = None) -> int:
    # a TERM (a job's timeout, `kill`) unwinds like ^C: the `finally` blocks unmount every mount
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    code = sections.dispatch(sys.argv[1:] if argv is None else argv)
    if code is not None:
        return code
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="shufflefs-bench-", dir=args.tmp))
    try:
        report = Bench(args, work).run()
    finally:
        if args.keep:
            print(f"bench: work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = report.markdown()
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.update_docs:
        from bench import docs

        machine = f"{proc.cpu_name()} ({os.cpu_count()} CPUs, {proc.mem_gib():.0f} GiB RAM)"
        for path in docs.update(report, text, REPO, machine):
            print(f"bench: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
