"""shufflefs against the loaders people use, on one label-sorted dataset (``tools/bench.py --only peers``).

Every contender runs in its own process (`peers_child`), one after the other; shufflefs rows get a
fresh mount (and a fresh index cache) each, made here with the benchmark's `proc.FuseDaemon` and
unmounted in a ``finally``.  The dataset and what is measured are described in `peers_data` and
`peers_child`; the section text in `peers_docs`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shufflefs.cli.mount import daemon_python

from . import peers_data, peers_docs, proc
from .peers_mds import ensure_venv

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHILD = HERE / "peers_child.py"
BUFFER_BYTES = 64 << 20


@dataclass
class Spec:
    key: str  # a contender of peers_readers / peers_mds
    name: str  # the table's row
    mount: list[str] | None = None  # shufflefs mount options (None: no mount)
    tar: bool = False  # reads the tar shards
    streaming: bool = False  # runs in the Streaming venv


SPECS = [
    Spec("shufflefs-loop", "shufflefs default, Python loop", mount=[]),
    Spec("shufflefs-parts", "shufflefs default, DataLoader over `.parts`", mount=[]),
    Spec("shufflefs-wds", "shufflefs default, WebDataset over tar views", mount=[], tar=True),
    Spec("shufflefs-loop", "shufflefs `--strategy full`, Python loop", mount=["--strategy", "full"]),
    Spec("shufflefs-loop", "shufflefs `--strategy corgipile`, Python loop", mount=["--strategy", "corgipile"]),
    Spec("pread", "pread Dataset + RandomSampler"),
    Spec("hf-map", "HF datasets `.shuffle()`"),
    Spec("hf-iterable", "HF datasets iterable `.shuffle(buffer)`"),
    Spec("wds", "WebDataset shardshuffle + buffer", tar=True),
    Spec("litdata", "litdata StreamingDataset"),
    Spec("streaming-loader", "MosaicML Streaming, DataLoader", streaming=True),
    Spec("streaming-direct", "MosaicML Streaming, direct iteration", streaming=True),
]


@dataclass
class Result:
    spec: Spec
    skipped: str = ""
    out: dict = field(default_factory=dict)
    prep_s: float = 0.0
    extra_disk: int = 0
    metrics: dict = field(default_factory=dict)
    mount_s: float = 0.0

    def rate(self, cache: str) -> float | None:
        r = self.out.get(cache)
        return r["samples"] / r["seconds"] if r and r["seconds"] > 0 else None


class Peers:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.n = args.records
        self.started = time.perf_counter()
        self.results: list[Result] = []
        self.cold = proc.can_drop_caches() and not args.no_cold
        self.buffer_records = int(BUFFER_BYTES // 1100)  # ~1.1 KB per record with its framing
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ data

    def prepare(self) -> None:
        data = Path(self.args.data) if self.args.data else self.work / "data"
        self.src = data / "jsonl"
        self.tars = data / "tar"
        self.src.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.src / peers_data.JSONL
        stamp = data / "records.txt"
        if not self.jsonl.exists() or not stamp.exists() or stamp.read_text().strip() != str(self.n):
            shutil.rmtree(self.tars, ignore_errors=True)
            self.say(f"generating {self.n:,} label-sorted records")
            peers_data.make_jsonl(self.jsonl, self.n)
            stamp.write_text(f"{self.n}\n")
        timing = self.tars / "seconds.json"
        if not timing.exists():
            self.say("writing tar shards")
            shards, secs = peers_data.write_shards(self.jsonl, self.tars)
            timing.write_text(json.dumps({"seconds": secs}))
        self.shards = sorted(self.tars.glob("shard-*.tar"))
        self.tar_s = json.loads(timing.read_text())["seconds"]
        self.data_bytes = self.jsonl.stat().st_size
        self.tar_bytes = peers_data.du(*self.shards)
        self.upto = self.n if self.args.quick else min(self.n, self.args.min_samples)
        self.uniform = peers_data.uniform_reference(self.n, self.upto)
        self.say(f"{self.n:,} records, {self.data_bytes / 1e6:.0f} MB; {len(self.shards)} tar shards "
                 f"({self.tar_bytes / 1e6:.0f} MB, {self.tar_s:.1f} s); uniform label mix "
                 f"{self.uniform['mix']:.4f} (expected {self.uniform['expected_mix']:.4f}), gap entropy "
                 f"{self.uniform['entropy']:.2f}")

    # ------------------------------------------------------------------ contenders

    def python_for(self, spec: Spec) -> tuple[str | None, str]:
        if spec.streaming:
            py, why = ensure_venv(Path(self.args.streaming_venv), self.say)
            return (str(py) if py else None), why
        if spec.key == "litdata":
            try:
                import litdata  # noqa: F401
            except ImportError as e:
                return None, f"litdata is not importable in this venv ({e}); `pip install litdata` to add it"
        return sys.executable, ""

    def run_one(self, i: int, spec: Spec) -> Result:
        res = Result(spec)
        py, why = self.python_for(spec)
        if py is None:
            res.skipped = why
            return res
        cwork = self.work / f"c{i:02d}-{spec.key}"
        cwork.mkdir(parents=True, exist_ok=True)
        cfg = {"contender": spec.key, "n": self.n, "jsonl": str(self.jsonl), "work": str(cwork),
               "max_seconds": self.args.max_seconds, "min_samples": self.upto, "cold": self.cold,
               "buffer_records": self.buffer_records, "shard_sources": [str(s) for s in self.shards],
               "mds": str(self.work / "mds")}
        if spec.mount is None:
            return self._child(res, py, cfg, cwork)
        mnt = cwork / "mnt"
        mnt.mkdir()
        src = self.tars if spec.tar else self.src
        cmd = [*daemon_python(), "mount", "-f", str(src), str(mnt), "--cache-dir", str(cwork / "index"),
               "--log-file", str(cwork / "daemon.log"), *spec.mount]
        if spec.tar:
            cfg["shards"] = [s.name for s in self.shards]
        cfg["mnt"] = str(mnt)
        d = proc.FuseDaemon(cmd, mnt, cwork / "daemon.out", env=self.env)
        try:
            d.start()
            res.mount_s = d.ready_s
            cfg["watch"] = [d.pid]
            return self._child(res, py, cfg, cwork)
        finally:
            d.stop()

    def _child(self, res: Result, py: str, cfg: dict, cwork: Path) -> Result:
        spec = res.spec
        cfg_path, out_path = cwork / "config.json", cwork / "result.json"
        cfg_path.write_text(json.dumps(cfg))
        self.say(f"--- {res.spec.name}")
        with open(cwork / "child.log", "wb") as log:
            p = subprocess.Popen([py, str(CHILD), str(cfg_path), str(out_path)], stdout=log, stderr=log,
                                 env=self.env, cwd=str(cwork), start_new_session=True)
            try:
                p.wait(timeout=self.args.child_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)  # its own session: the child and its workers only
                p.wait()
        if p.returncode != 0 or not out_path.exists():
            tail = (cwork / "child.log").read_text(errors="replace").strip().splitlines()[-3:]
            res.skipped = f"failed (exit {p.returncode}): {' / '.join(tail)[-300:]}"
            self.say(res.skipped)
            return res
        res.out = json.loads(out_path.read_text())
        got = np.load(str(out_path) + ".npz")
        res.metrics = peers_data.order_metrics(got["ids"], got["labels"], self.n, self.upto)
        res.prep_s = res.mount_s + res.out["prep_s"]
        info = res.out.get("info") or {}
        if info.get("conversion_shared"):
            res.prep_s += info["conversion_s"]
        # what the contender wrote (its subdirectories: not the mount point, not the logs)
        res.extra_disk = peers_data.du(*[d for d in cwork.iterdir() if d.is_dir() and d.name != "mnt"]) + (peers_data.du(Path(cfg["mds"])) if spec.streaming else 0)
        if spec.tar:  # the tar shards are a second copy of the data
            res.prep_s += self.tar_s
            res.extra_disk += self.tar_bytes
        w, c = res.rate("warm"), res.rate("cold")
        self.say(f"{spec.name}: prep {res.prep_s:.1f} s, warm {w or 0:,.0f}/s, cold {c or 0:,.0f}/s, "
                 f"mix {res.metrics['mix']:.4f}, entropy {res.metrics['entropy']:.2f}")
        return res

    def run(self) -> None:
        self.prepare()
        wanted = set(self.args.contenders.split(",")) if self.args.contenders else None
        for i, spec in enumerate(SPECS):
            if wanted and spec.key not in wanted:
                continue
            self.results.append(self.run_one(i, spec))
        shutil.rmtree(self.work / "mds", ignore_errors=True)
        self.seconds = time.perf_counter() - self.started


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="shufflefs against the loaders people use (tools/bench.py --only peers; see tools/bench/peers.py)")
    ap.add_argument("--records", type=int, help="records in the dataset (default 1,000,000; 50,000 with --quick)")
    ap.add_argument("--quick", action="store_true", help="a small smoke run: 50,000 records, reads cut at 10 s")
    ap.add_argument("--max-seconds", type=float, help="cut each pass here (default 60; 10 with --quick)")
    ap.add_argument("--min-samples", type=int, default=200_000,
                    help="the warm pass reads at least this many samples (the label mix's sample)")
    ap.add_argument("--contenders", default="", help="comma-separated contender keys (default all): " + ",".join(dict.fromkeys(s.key for s in SPECS)))
    ap.add_argument("--data", help="keep the generated dataset in this directory (reused by later runs)")
    ap.add_argument("--tmp", help="where the work directory is made (default: the system's temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold passes")
    ap.add_argument("--child-timeout", type=float, default=1800.0, help="seconds before a contender is ended")
    ap.add_argument("--streaming-venv", default="/work/peers-venv",
                    help="the venv for MosaicML Streaming (made on first use)")
    ap.add_argument("--out", type=Path, help="also write the section here")
    ap.add_argument("--update-docs", action="store_true", help="write the section into docs/benchmark.md")
    args = ap.parse_args(argv)
    args.records = args.records or (50_000 if args.quick else 1_000_000)
    args.max_seconds = args.max_seconds or (10.0 if args.quick else 60.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="shufflefs-peers-", dir=args.tmp))
    try:
        peers = Peers(args, work)
        peers.run()
    finally:
        if args.keep:
            print(f"peers: work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    lines = peers_docs.section(peers, argv if argv is not None else sys.argv[1:])
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.update_docs:
        path = peers_docs.write(REPO / "docs" / "benchmark.md", lines)
        print(f"peers: wrote {path}", file=sys.stderr)
        readme = REPO / "README.md"
        if peers_docs.README_START in readme.read_text():
            peers_docs.write(readme, peers_docs.readme(peers), peers_docs.README_START, peers_docs.README_END)
            print(f"peers: wrote {readme}", file=sys.stderr)
    return 0
