"""Mixtures compared: a shufflefs ``[[mix]]`` against Hugging Face ``interleave_datasets`` and
MosaicML Streaming's ``Stream(proportion=...)``/``Stream(choose=...)``, on one generated dataset.

Three JSON-lines sources: web (60,000 short records), books (3,000 long ones), code (20,000).
The blend asks for 30,000 records per epoch at 0.6 / 0.2 / 0.2: web and code down-sampled
(18,000 of 60,000; 6,000 of 20,000), books up-sampled (6,000 of 3,000).  For two epochs of each
loader it reports, from the records it delivered:

* records per epoch and per source;
* repeats inside an epoch of a down-sampled source (web: 0 wanted);
* web records of epoch 1 already given in epoch 0 (0 wanted until all 60,000 were given);
* how far each source's share in every 1,000 consecutive records is from its share (mean, worst);
* records per second (each loader's own reading path: not a like-for-like speed race).

    python tools/bench.py --only mix-compare [--records-scale 1.0]

Streaming is optional (``pip install streaming-community``, or ``mosaicml-streaming``); without it
its rows are left out.  Its package imports torchvision at import time: where torchvision is
missing or does not load against the installed torch, this script puts an empty stand-in in its
place (streaming's mixing code does not use it) and says so.
"""

from __future__ import annotations

import argparse
import collections
import importlib.machinery
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tools"), str(REPO)]
from .proc import FuseDaemon  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
WEIGHTS = {"web": 0.6, "books": 0.2, "code": 0.2}
SIZES = {"web": (60_000, 200), "books": (3_000, 3000), "code": (20_000, 800)}  # records, mean length
SAMPLES = 30_000


def make_sources(root: Path, scale: float) -> dict[str, list[Path]]:
    rng = np.random.default_rng(0)
    out = {}
    for src, (n, width) in SIZES.items():
        n = int(n * scale)
        d = root / src
        d.mkdir(parents=True)
        files = []
        per = -(-n // 4)
        for f in range(4):
            path = d / f"{src}-{f:05d}.jsonl"
            with open(path, "w") as fh:
                for k in range(f * per, min(n, (f + 1) * per)):
                    fh.write(json.dumps({"src": src, "id": k, "text": "x" * int(rng.integers(width // 2, width * 3 // 2))}) + "\n")
            files.append(path)
        out[src] = files
    return out


def measure(epochs: list[list[tuple[str, int]]], seconds: float) -> dict:
    """The report's figures for a loader's epochs of (source, id) records."""
    names = list(WEIGHTS)
    code = {s: i for i, s in enumerate(names)}
    devs, worst = [], 0.0
    for recs in epochs:
        seq = np.array([code[s] for s, _ in recs])
        share = np.bincount(seq, minlength=len(names)) / max(len(seq), 1)
        m = len(seq) // 1000 * 1000
        if m:
            c = np.stack([np.bincount(r, minlength=len(names)) for r in seq[:m].reshape(-1, 1000)]) / 1000
            d = np.abs(c - share)
            devs.append(float(d.mean()))
            worst = max(worst, float(d.max()))
    web = [collections.Counter(k for s, k in recs if s == "web") for recs in epochs]
    return {
        "records": [len(r) for r in epochs],
        "per_source": [dict(collections.Counter(s for s, _ in r)) for r in epochs],
        "web_repeats": [sum(c - 1 for c in w.values()) for w in web],
        "web_again": len(web[1].keys() & web[0].keys()) if len(web) > 1 else None,
        "books_max": [max(collections.Counter(k for s, k in r if s == "books").values(), default=0) for r in epochs],
        "dev_mean": float(np.mean(devs)) if devs else None,
        "dev_worst": worst if devs else None,
        "records_per_s": sum(len(r) for r in epochs) / max(seconds, 1e-9),
    }


def parse(lines) -> list[tuple[str, int]]:
    out = []
    for line in lines:
        r = json.loads(line)
        out.append((r["src"], r["id"]))
    return out


def run_shufflefs(root: Path, work: Path, strategy: str, samples: int) -> dict:
    cfg = work / f"mix-{strategy}.toml"
    text = f'[[mix]]\nname = "blend"\nsamples = {samples}\n'
    for src, w in WEIGHTS.items():
        text += f'[[mix.source]]\nglob = "{src}/*.jsonl"\nweight = {w}\n'
    cfg.write_text(text)
    mnt = work / f"mnt-{strategy}"
    mnt.mkdir()
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(root), str(mnt), "--config", str(cfg),
           "--strategy", strategy, "--cache-dir", str(work / "cache")]
    with FuseDaemon(cmd, mnt, work / f"daemon-{strategy}.log", ENV):
        epochs, t0 = [], time.monotonic()
        for e in range(2):
            os.setxattr(mnt, "user.shufflefs.epoch", str(e).encode())
            d = mnt / ".mix" / "blend"
            recs = []
            for name in sorted(os.listdir(d)):
                with open(d / name, "rb") as f:
                    recs.extend(parse(f))
            epochs.append(recs)
        return measure(epochs, time.monotonic() - t0)


def run_hf(files: dict[str, list[Path]], stopping: str) -> dict:
    from datasets import interleave_datasets, load_dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    sets = [load_dataset("json", data_files=[str(p) for p in files[s]], split="train") for s in WEIGHTS]
    epochs, t0 = [], time.monotonic()
    for e in range(2):  # the usual recipe: shuffle each source with the epoch's seed, then interleave
        mixed = interleave_datasets([d.shuffle(seed=e) for d in sets], probabilities=list(WEIGHTS.values()),
                                    seed=e, stopping_strategy=stopping)
        epochs.append([(r["src"], r["id"]) for r in mixed.select_columns(["src", "id"])])
    return measure(epochs, time.monotonic() - t0)


def _import_streaming() -> tuple[types.ModuleType | None, str]:
    note = ""
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- any failure to load: a stand-in (see the docstring)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # what a failed import left behind
        for name, attrs in (("torchvision", {}), ("torchvision.datasets", {"VisionDataset": object, "CIFAR10": object}),
                            ("torchvision.transforms", {}), ("torchvision.transforms.functional", {"to_tensor": None})):
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stub.__path__ = []
            stub.__dict__.update(attrs)
            sys.modules[name] = stub
        note = f"torchvision replaced by an empty stand-in ({type(e).__name__})"
    try:
        import streaming
    except ImportError as e:
        return None, f"not installed ({e})"
    return streaming, note


def run_streaming(streaming: types.ModuleType, files: dict[str, list[Path]], work: Path, mode: str,
                  samples: int) -> dict:
    from streaming import MDSWriter, Stream, StreamingDataset

    streams = []
    for src, w in WEIGHTS.items():
        out = work / f"mds-{src}"
        if not out.exists():
            with MDSWriter(out=str(out), columns={"src": "str", "id": "int", "text": "str"}) as wr:
                for p in files[src]:
                    with open(p) as fh:
                        for line in fh:
                            wr.write(json.loads(line))
        if mode == "proportion":
            streams.append(Stream(local=str(out), proportion=w))
        else:
            streams.append(Stream(local=str(out), choose=int(samples * w)))
    ds = StreamingDataset(streams=streams, epoch_size=samples if mode == "proportion" else None, shuffle=True,
                          shuffle_seed=0, batch_size=1, cache_limit=None)
    epochs, t0 = [], time.monotonic()
    for _ in range(2):  # each pass over the dataset is its next epoch
        epochs.append([(r["src"], int(r["id"])) for r in ds])
    return measure(epochs, time.monotonic() - t0)


def _fmt(value: float | int | None, spec: str) -> str:
    """A table cell; ``-`` where a small run has no value (one epoch, or fewer than 1,000 records)."""
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records-scale", type=float, default=1.0,
                    help="scale every source's record count and the records asked for")
    args = ap.parse_args(argv)
    rows = {}
    samples = int(SAMPLES * args.records_scale)
    with tempfile.TemporaryDirectory(prefix="mixcmp-") as tmp:
        work = Path(tmp)
        root = work / "src"
        files = make_sources(root, args.records_scale)
        for strategy in ("stratified", "corgipile"):
            rows[f"shufflefs [[mix]] ({strategy})"] = run_shufflefs(root, work, strategy, samples)
        for stopping in ("first_exhausted", "all_exhausted"):
            rows[f"HF interleave_datasets ({stopping})"] = run_hf(files, stopping)
        streaming, note = _import_streaming()
        if streaming is not None:
            os.environ.setdefault("STREAMING_SHM_PREFIX", f"mixcmp{os.getpid()}")
            for mode in ("proportion", "choose"):
                rows[f"Streaming Stream({mode}=...)"] = run_streaming(streaming, files, work, mode, samples)
        if note:
            print(f"streaming: {note}")
    print(f"asked: {samples} records per epoch, weights {WEIGHTS}; sources " +
          ", ".join(f"{s} {int(n * args.records_scale)}" for s, (n, _) in SIZES.items()))
    print("| loader | records e0 / e1 | web / books / code (e0) | web repeats e0 | web of e1 seen in e0 "
          "| books max copies | share off, mean / worst per 1,000 | records/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        per = r["per_source"][0]
        print(f"| {name} | {r['records'][0]:,} / {r['records'][1]:,} | "
              f"{per.get('web', 0):,} / {per.get('books', 0):,} / {per.get('code', 0):,} | {r['web_repeats'][0]:,} | "
              f"{_fmt(r['web_again'], ',')} | {r['books_max'][0]} | {_fmt(r['dev_mean'], '.3f')} / "
              f"{_fmt(r['dev_worst'], '.3f')} | "
              f"{r['records_per_s']:,.0f} |")
    print("\n" + json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
