#!/usr/bin/env python3
"""Does SGD converge when it reads label-clustered data through a shufflefs view?

    python tools/convergence.py [--quick] [--rows N] [--epochs E] [--out DIR]
                                [--strategies S,...] [--models M,...] [--datasets D,...]
                                [--formats F,...] [--blocks N] [--seed N] [--work DIR]

Reproduces the CorgiPile paper's convergence comparison (§7.3.2 Table 3, §7.3.4) through real
mounts.  Two label-clustered training sets, each stored as JSONL and as fixed-size binary records:

- ``digits``: scikit-learn's bundled 8x8 digits (10 classes, 1,437 training rows);
- ``synthetic``: a binary ``make_classification`` problem with ``--rows`` training rows (1 M).

The test set is split off (stratified) before the training set is sorted by label, and is read
straight from memory.  For every strategy the training directory is mounted with ``shufflefs
mount``; each epoch sets the mount's epoch and reads the training file front to back through the
mount, and the records are fed to plain SGD as mini-batches in exactly the order read.  Logistic
regression, a linear SVM (hinge loss) and a one-hidden-layer MLP train side by side on the same
batches.  Writes ``results.csv``, ``results.md`` (final train/test accuracy), ``curves.csv``
(accuracy per epoch), ``accuracy.png`` and ``accuracy-zoom.png`` (test accuracy per epoch) to
``--out``; ``--replot`` draws the PNGs again from ``curves.csv``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from shufflefs.strategies import STRATEGIES  # noqa: E402

EPOCH_XATTR = "user.shufflefs.epoch"
INFO_XATTR = "user.shufflefs.info"
FORMATS = ("jsonl", "fixed")
MODELS = ("logreg", "svm", "mlp")
MODEL_TITLES = {"logreg": "logistic regression", "svm": "linear SVM (hinge)", "mlp": "MLP (1 hidden layer)"}
READ_CHUNK = 8 << 20
PLS_Q = (0.0, 0.1, 0.3)
PLS_WORLD = 4
PLS_Q_OPTION = "--exchange"
"""The mount option expected to carry partial local shuffling's exchange fraction Q."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Hyper:
    """Training settings of one dataset: plain SGD with a fixed learning rate per model."""

    epochs: int
    batch: int
    blocks: int
    """Target number of blocks of the training file; sets the block size of every strategy."""
    lr: dict[str, float]
    weight_decay: dict[str, float] = field(default_factory=lambda: {"svm": 1e-4})
    hidden: int = 64


HYPER = {
    # A linear model separates the digits training set: without an L2 penalty every record's
    # gradient vanishes once the set is fitted, and the order stops mattering after an epoch or
    # two.  Weight decay keeps the gradients alive, as label noise does on the synthetic problem
    # and on the paper's datasets.
    "digits": Hyper(epochs=30, batch=32, blocks=200, lr={"logreg": 0.5, "svm": 0.1, "mlp": 0.5},
                    weight_decay={"logreg": 0.03, "svm": 0.03, "mlp": 0.03}),
    "synthetic": Hyper(epochs=8, batch=128, blocks=1000, lr={"logreg": 0.01, "svm": 0.01, "mlp": 0.05},
                       weight_decay={"svm": 1e-4}),
}


@dataclass(frozen=True)
class Variant:
    """One strategy with its parameters, as a curve in the results."""

    label: str
    strategy: str
    """The `--strategy` option; "" mounts with no strategy, block size or buffer option (defaults)."""
    buffer: str = "10%"
    """The `--buffer` option: shapes corgipile, stratified and window; only the prefetch window elsewhere."""
    world: int = 1
    """Simulated data-parallel ranks: one mount per rank, their batches interleaved."""
    extra: tuple[str, ...] = ()


def all_variants() -> list[Variant]:
    out = [Variant("none", "none"), Variant("once", "once"), Variant("full", "full"),
           Variant("lirs-page", "lirs-page")]
    out += [Variant(f"{s}-{b}", s, b) for s in ("corgipile", "stratified") for b in ("1%", "2%", "10%")]
    out += [Variant("default", "", "")]
    out += [Variant("block", "block"), Variant("window-10%", "window", "10%")]
    out += [Variant(f"pls-q{q:g}", "pls", "10%", PLS_WORLD, (PLS_Q_OPTION, f"{q:g}")) for q in PLS_Q]
    return out


def pls_missing() -> str | None:
    """Why the `pls` variants cannot run here, or None when they can."""
    if "pls" not in STRATEGIES:
        return "strategy 'pls' does not exist in this version of shufflefs"
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", "--help"], capture_output=True, text=True)
    if PLS_Q_OPTION not in r.stdout:
        return f"'shufflefs mount' has no {PLS_Q_OPTION} option for the exchange fraction Q"
    return None


def select_variants(names: Sequence[str] | None) -> tuple[list[Variant], list[str]]:
    """Variants by label (``corgipile-2%``) or by strategy (``corgipile`` takes all buffers),
    and notes on those that cannot run."""
    variants = all_variants()
    if names:
        unknown = [n for n in names if not any(n in (v.label, v.strategy) for v in variants)]
        if unknown:
            raise SystemExit(f"unknown strategies {unknown}; known: {[v.label for v in variants]}")
        variants = [v for v in variants if v.label in names or v.strategy in names]
    notes = []
    if any(v.strategy == "pls" for v in variants) and (why := pls_missing()):
        notes.append(f"pls (W={PLS_WORLD} ranks, Q={', '.join(f'{q:g}' for q in PLS_Q)}) skipped: {why}.")
        variants = [v for v in variants if v.strategy != "pls"]
    return variants, notes


# --------------------------------------------------------------------------- datasets


@dataclass
class Data:
    """A training set sorted by label (the order written to the files) and its test set."""

    name: str
    x_train: np.ndarray  # float32 (n, d)
    y_train: np.ndarray  # int64 (n,)
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    decimals: int | None
    """Digits after the point in JSONL; None writes integers. Features are rounded to it."""
    seed: int = 0

    @property
    def dim(self) -> int:
        return self.x_train.shape[1]


def label_sorted(name: str, x: np.ndarray, y: np.ndarray, test_size: int | float, seed: int,
                 decimals: int | None) -> Data:
    """Split off a stratified test set, then sort the training set by label (stably)."""
    from sklearn.model_selection import train_test_split

    x = (np.round(x, decimals) if decimals is not None else x).astype(np.float32)
    y = y.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, stratify=y, random_state=seed)
    order = np.argsort(y_tr, kind="stable")
    return Data(name, np.ascontiguousarray(x_tr[order]), y_tr[order], x_te, y_te, int(y.max()) + 1, decimals, seed)


def digits_data(seed: int = 0) -> Data:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return label_sorted("digits", x, y, 0.2, seed, None)


def synthetic_data(rows: int = 1_000_000, seed: int = 0) -> Data:
    """A binary problem that a linear model solves to ~80% and an MLP to more; ``rows`` train rows."""
    from sklearn.datasets import make_classification

    test = max(rows // 4, 2)
    x, y = make_classification(n_samples=rows + test, n_features=20, n_informative=10, n_redundant=4,
                               n_clusters_per_class=2, flip_y=0.02, class_sep=1.0, random_state=seed)
    return label_sorted("synthetic", x, y, test, seed, 4)


def load_data(name: str, rows: int, seed: int) -> Data:
    return digits_data(seed) if name == "digits" else synthetic_data(rows, seed)


# --------------------------------------------------------------------------- files


def record_dtype(dim: int) -> np.dtype:
    """A fixed-size record: ``dim`` little-endian float32 features, then the int32 label."""
    return np.dtype([("x", "<f4", (dim,)), ("label", "<i4")])


def write_fixed(path: Path, x: np.ndarray, y: np.ndarray) -> int:
    """Write the records; returns the record size in bytes."""
    rec = np.empty(len(y), record_dtype(x.shape[1]))
    rec["x"], rec["label"] = x, y
    rec.tofile(path)
    return rec.dtype.itemsize


def jsonl_line_format(dim: int, decimals: int | None) -> str:
    num = "%d" if decimals is None else f"%.{decimals}f"
    return '{"label": %d, "x": [' + ", ".join([num] * dim) + "]}\n"


def write_jsonl(path: Path, x: np.ndarray, y: np.ndarray, decimals: int | None, chunk: int = 100_000) -> None:
    """One JSON object per line, ``{"label": 3, "x": [...]}``, features as ``decimals`` fixed-point."""
    fmt = jsonl_line_format(x.shape[1], decimals)
    with open(path, "w") as f:
        for lo in range(0, len(y), chunk):
            xs = x[lo:lo + chunk].astype(np.float64)
            if decimals is None:
                xs = xs.astype(np.int64)
            rows = np.concatenate([y[lo:lo + chunk, None].astype(xs.dtype), xs], axis=1)
            f.write("".join(fmt % tuple(r) for r in rows.tolist()))


_JSON_PUNCT = bytes.maketrans(b'{}[]:,"', b"       ")


def parse_jsonl(buf: bytes, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Records of whole JSONL lines, in order, by a numeric parse of the line layout
    `write_jsonl` uses (a ``json.loads`` per line would cost twice as much at 1 M rows).

    The layout is checked: the first line through ``json``, every line by the number count.
    """
    if not buf:
        return np.empty((0, dim), np.float32), np.empty(0, np.int64)
    n = buf.count(b"\n")
    first = json.loads(buf[: buf.index(b"\n")])
    if list(first) != ["label", "x"] or len(first["x"]) != dim:
        raise ValueError(f"unexpected JSONL record layout: {buf[:80]!r}")
    nums = np.fromstring(buf.translate(_JSON_PUNCT, b"labelx"), dtype=np.float64, sep=" ")
    if nums.size != n * (dim + 1):
        raise ValueError(f"{n} lines but {nums.size} numbers (expected {dim + 1} per line)")
    nums = nums.reshape(n, dim + 1)
    return nums[:, 1:].astype(np.float32), nums[:, 0].astype(np.int64)


def read_records(path: Path, fmt: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Read a training file front to back with ordinary file reads; records in file order."""
    xs, ys = [], []
    if fmt == "fixed":
        dt = record_dtype(dim)
        chunk = max(1, READ_CHUNK // dt.itemsize) * dt.itemsize
        rest = b""
        with open(path, "rb", buffering=0) as f:
            while data := f.read(chunk):
                data = rest + data
                cut = len(data) - len(data) % dt.itemsize
                rest = data[cut:]
                rec = np.frombuffer(data[:cut], dt)
                xs.append(rec["x"])
                ys.append(rec["label"].astype(np.int64))
        if rest:
            raise ValueError(f"{path}: {len(rest)} bytes after the last whole record")
    else:
        rest = b""
        with open(path, "rb", buffering=0) as f:
            while data := f.read(READ_CHUNK):
                data = rest + data
                cut = data.rfind(b"\n") + 1
                rest = data[cut:]
                x, y = parse_jsonl(data[:cut], dim)
                xs.append(x)
                ys.append(y)
        if rest:
            x, y = parse_jsonl(rest + b"\n", dim)
            xs.append(x)
            ys.append(y)
    if not xs:
        return np.empty((0, dim), np.float32), np.empty(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys)


@dataclass(frozen=True)
class Stored:
    """A training set written in one format: its directory (the mount source) and block size."""

    data: Data
    fmt: str
    src: Path
    record_size: int | None
    block_size: int
    blocks: int

    @property
    def file(self) -> str:
        return "train.bin" if self.fmt == "fixed" else "train.jsonl"

    def mount_args(self, block_size: bool = True) -> list[str]:
        args = ["--block-size", str(self.block_size)] if block_size else []
        if self.record_size is not None:
            args += ["--record-size", str(self.record_size)]
        return args


def store(data: Data, fmt: str, root: Path, blocks: int) -> Stored:
    """Write ``data``'s training set as ``fmt`` under ``root`` (reused if already there) and pick
    a block size that cuts it into about ``blocks`` blocks of whole-ish records."""
    src = root / f"{data.name}-{len(data.y_train)}-seed{data.seed}-{fmt}"
    src.mkdir(parents=True, exist_ok=True)
    path = src / ("train.bin" if fmt == "fixed" else "train.jsonl")
    n = len(data.y_train)
    record_size = record_dtype(data.dim).itemsize if fmt == "fixed" else None
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        if fmt == "fixed":
            write_fixed(tmp, data.x_train, data.y_train)
        else:
            write_jsonl(tmp, data.x_train, data.y_train, data.decimals)
        tmp.rename(path)
    size = path.stat().st_size
    per_block = max(1, round(n / blocks))
    block_size = per_block * record_size if record_size else max(1, round(size / n * per_block))
    return Stored(data, fmt, src, record_size, block_size, -(-size // block_size))


# --------------------------------------------------------------------------- mounts


def shufflefs_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "shufflefs", *args]


def unmount(mnt: Path) -> None:
    """Unmount, falling back to a lazy unmount so that nothing is left behind."""
    r = subprocess.run(shufflefs_cmd("umount", str(mnt)), capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)


@contextmanager
def mounted(src: Path, mnt: Path, cache: Path, args: Sequence[str], log: Path | None = None) -> Iterator[Path]:
    """A real shufflefs mount of ``src`` at ``mnt`` for the duration of the block."""
    mnt.mkdir(parents=True, exist_ok=True)
    cmd = shufflefs_cmd("mount", str(src), str(mnt), "--cache-dir", str(cache), *args)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd += ["--log-file", str(log)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        unmount(mnt)
        raise
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    try:
        yield mnt
    finally:
        unmount(mnt)


def set_epoch(mnt: Path, epoch: int) -> None:
    os.setxattr(mnt, EPOCH_XATTR, str(epoch).encode())


def interleave(parts: Sequence[tuple[np.ndarray, np.ndarray]], micro: int) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel SGD seen from the model: step i takes micro-batch i of every rank in turn
    (CorgiPile §5, Fig. 5); a rank whose share is used up contributes nothing."""
    lens = np.array([len(y) for _, y in parts], np.int64)
    if not lens.sum():
        return parts[0]
    rank = np.repeat(np.arange(len(parts)), lens)
    pos = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
    order = np.lexsort((pos, rank, pos // micro))
    return np.concatenate([x for x, _ in parts])[order], np.concatenate([y for _, y in parts])[order]


Reader = Callable[[int], tuple[np.ndarray, np.ndarray]]


@contextmanager
def view_reader(stored: Stored, variant: Variant, work: Path, seed: int, batch: int) -> Iterator[Reader]:
    """``reader(epoch)`` -> the training records of that epoch in the order the mount serves them.

    With ``variant.world`` > 1 every simulated rank has its own mount and the ranks' records are
    interleaved micro-batch by micro-batch, as data-parallel SGD consumes them.
    """
    chosen = ["--strategy", variant.strategy, "--buffer", variant.buffer] if variant.strategy else []
    base = [*chosen, "--seed", str(seed), *stored.mount_args(bool(variant.strategy)), *variant.extra]
    tag = f"{stored.src.name}-{variant.label.replace('%', 'pc')}"
    with ExitStack() as stack:
        mnts = []
        for r in range(variant.world):
            args = base + (["--rank", str(r), "--world", str(variant.world)] if variant.world > 1 else [])
            mnts.append(stack.enter_context(mounted(stored.src, work / "mnt" / f"{tag}-r{r}", work / "cache",
                                                    args, work / "logs" / f"{tag}-r{r}.log")))

        def read(epoch: int) -> tuple[np.ndarray, np.ndarray]:
            parts = []
            for mnt in mnts:
                set_epoch(mnt, epoch)
                parts.append(read_records(mnt / stored.file, stored.fmt, stored.data.dim))
            if len(parts) == 1:
                return parts[0]
            return interleave(parts, max(1, batch // len(parts)))

        read.info = json.loads(os.getxattr(mnts[0] / stored.file, INFO_XATTR))  # what the view resolved
        yield read


# --------------------------------------------------------------------------- models


def build_models(names: Sequence[str], dim: int, n_classes: int, hyper: Hyper, seed: int):
    """The models, all initialised from ``seed`` so every strategy starts from the same weights."""
    import torch

    torch.manual_seed(seed)
    out = 1 if n_classes == 2 else n_classes
    models = {}
    for name in names:
        if name == "mlp":
            models[name] = torch.nn.Sequential(torch.nn.Linear(dim, hyper.hidden), torch.nn.ReLU(),
                                               torch.nn.Linear(hyper.hidden, out))
        else:
            models[name] = torch.nn.Linear(dim, out)
    return models


def model_loss(name: str, out, y, n_classes: int):
    import torch.nn.functional as F

    if n_classes == 2:
        out = out.squeeze(-1)
        if name == "svm":
            return F.relu(1.0 - (2.0 * y.float() - 1.0) * out).mean()
        return F.binary_cross_entropy_with_logits(out, y.float())
    if name == "svm":
        return F.multi_margin_loss(out, y)
    return F.cross_entropy(out, y)


def accuracy(model, x, y, n_classes: int) -> float:
    import torch

    with torch.no_grad():
        out = model(x)
        pred = (out.squeeze(-1) > 0).long() if n_classes == 2 else out.argmax(1)
        return float((pred == y).float().mean())


@dataclass
class Curve:
    """Accuracy per epoch of one (dataset, format, strategy, model)."""

    train: list[float] = field(default_factory=list)
    test: list[float] = field(default_factory=list)


@dataclass
class Run:
    dataset: str
    fmt: str
    variant: Variant
    block_size: int
    blocks: int
    records: int
    hyper: Hyper
    curves: dict[str, Curve]
    seconds: float
    info: dict = field(default_factory=dict)
    """The view's `user.shufflefs.info` (rank 0's)."""

    @property
    def buffer(self) -> str:
        return self.variant.buffer or str(self.info.get("buffer", ""))

    def label(self) -> str:
        """The variant, and for the mount's defaults what they resolved to."""
        if self.variant.strategy:
            return self.variant.label
        i = self.info
        return f"{self.variant.label}: {i.get('strategy')}, block {i.get('block_size')} B ({i.get('blocks')}), buffer {i.get('buffer')}"


def train(data: Data, reader: Reader, models: Sequence[str], hyper: Hyper, epochs: int, seed: int,
          progress: Callable[[str], None] = print) -> dict[str, Curve]:
    """Plain mini-batch SGD over the records ``reader(epoch)`` returns, in that order.

    The models train side by side: one backward pass of the sum of their losses gives each model
    exactly its own gradient (their parameters are disjoint), with one step's overhead for all.
    Every epoch is checked to hold the training set's records (labels counted, features summed).
    """
    import torch

    torch.set_num_threads(1)  # the other core serves the mount
    mean = data.x_train.mean(0, dtype=np.float64)
    std = data.x_train.std(0, dtype=np.float64)
    std[std == 0] = 1.0

    def standard(x: np.ndarray):
        return torch.from_numpy(((x - mean) / std).astype(np.float32))

    x_train, y_train = standard(data.x_train), torch.from_numpy(data.y_train)
    x_test, y_test = standard(data.x_test), torch.from_numpy(data.y_test)
    ref_counts = np.bincount(data.y_train, minlength=data.n_classes)
    ref_sums = data.x_train.sum(0, dtype=np.float64)
    nets = build_models(models, data.dim, data.n_classes, hyper, seed)
    opt = torch.optim.SGD([{"params": m.parameters(), "lr": hyper.lr[k], "weight_decay": hyper.weight_decay.get(k, 0.0)}
                           for k, m in nets.items()], lr=0.0)
    curves = {k: Curve() for k in nets}
    for epoch in range(epochs):
        t0 = time.perf_counter()
        x, y = reader(epoch)
        t_read = time.perf_counter() - t0
        if len(y) != len(data.y_train) or not np.array_equal(np.bincount(y, minlength=data.n_classes), ref_counts):
            raise RuntimeError(f"epoch {epoch}: the view holds {len(y)} records with other labels than the source")
        if not np.allclose(x.sum(0, dtype=np.float64), ref_sums, rtol=1e-9, atol=1e-6):
            raise RuntimeError(f"epoch {epoch}: the view holds other feature values than the source")
        xt, yt = standard(x), torch.from_numpy(y)
        for lo in range(0, len(yt), hyper.batch):
            xb, yb = xt[lo:lo + hyper.batch], yt[lo:lo + hyper.batch]
            opt.zero_grad(set_to_none=True)
            loss = sum(model_loss(k, m(xb), yb, data.n_classes) for k, m in nets.items())
            loss.backward()
            opt.step()
        for k, m in nets.items():
            curves[k].train.append(accuracy(m, x_train, y_train, data.n_classes))
            curves[k].test.append(accuracy(m, x_test, y_test, data.n_classes))
        t_all = time.perf_counter() - t0
        accs = " ".join(f"{k} {curves[k].test[-1] * 100:5.1f}" for k in nets)
        progress(f"    epoch {epoch:2d}: read {t_read:5.2f}s  total {t_all:5.2f}s  test % {accs}")
    return curves


def run_variant(stored: Stored, variant: Variant, models: Sequence[str], hyper: Hyper, epochs: int,
                seed: int, work: Path, progress: Callable[[str], None] = print) -> Run:
    """Train ``models`` for ``epochs`` epochs on ``stored`` read through a mount of ``variant``."""
    t0 = time.perf_counter()
    with view_reader(stored, variant, work, seed, hyper.batch) as reader:
        info = reader.info
        if not variant.strategy:
            progress(f"    view defaults: {info.get('strategy')}, block size {info.get('block_size')} B, "
                     f"buffer {info.get('buffer')}, {info.get('blocks_per_buffer')} blocks per buffer")
        curves = train(stored.data, reader, models, hyper, epochs, seed, progress)
    block_size, blocks = ((stored.block_size, stored.blocks) if variant.strategy
                          else (info["block_size"], info["blocks"]))
    return Run(stored.data.name, stored.fmt, variant, block_size, blocks, len(stored.data.y_train), hyper, curves,
               time.perf_counter() - t0, info)


# --------------------------------------------------------------------------- output


RESULT_FIELDS = ["dataset", "format", "strategy", "model", "train_acc", "test_acc", "test_acc_last_quarter",
                 "epochs", "block_size", "blocks", "buffer", "world", "seconds", "view_strategy", "blocks_per_buffer"]


def write_results(runs: Sequence[Run], out: Path, notes: Sequence[str] = ()) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RESULT_FIELDS)
        for r in runs:
            for k, c in r.curves.items():
                tail = c.test[-max(1, len(c.test) // 4):]
                w.writerow([r.dataset, r.fmt, r.variant.label, k, f"{c.train[-1]:.4f}", f"{c.test[-1]:.4f}",
                            f"{sum(tail) / len(tail):.4f}", len(c.test), r.block_size, r.blocks, r.buffer, r.variant.world,
                            f"{r.seconds:.1f}", r.info.get("strategy", ""), r.info.get("blocks_per_buffer", "")])
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "format", "strategy", "model", "epoch", "train_acc", "test_acc"])
        for r in runs:
            for k, c in r.curves.items():
                for e, (a, b) in enumerate(zip(c.train, c.test)):
                    w.writerow([r.dataset, r.fmt, r.variant.label, k, e, f"{a:.4f}", f"{b:.4f}"])
    (out / "results.md").write_text(markdown_table(runs) + "".join(f"Note: {n}\n" for n in notes))


def groups(runs: Sequence[Run]) -> dict[tuple[str, str], list[Run]]:
    g: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        g.setdefault((r.dataset, r.fmt), []).append(r)
    return g


def markdown_table(runs: Sequence[Run]) -> str:
    """One table per dataset and format: final train / test accuracy (%) per strategy and model."""
    out = io.StringIO()
    for (ds, fmt), rs in groups(runs).items():
        r0 = rs[0]
        models = list(r0.curves)
        h = r0.hyper
        settings = ", ".join(f"{MODEL_TITLES.get(m, m).split(' (')[0]} {h.lr[m]:g}"
                             + (f" (weight decay {h.weight_decay[m]:g})" if h.weight_decay.get(m) else "")
                             for m in models)
        out.write(f"**{ds}, {fmt}**: {r0.records} records sorted by label, block size {r0.block_size} B "
                  f"(~{r0.records / r0.blocks:.0f} records, {r0.blocks} blocks), "
                  f"{len(r0.curves[models[0]].test)} epochs, batch {h.batch}, learning rate {settings}. "
                  f"Final train / test accuracy, %:\n\n")
        out.write("| strategy | " + " | ".join(MODEL_TITLES.get(m, m) for m in models) + " |\n")
        out.write("|---|" + "---|" * len(models) + "\n")
        for r in rs:
            cells = [f"{r.curves[m].train[-1] * 100:.1f} / {r.curves[m].test[-1] * 100:.1f}" for m in models]
            out.write(f"| {r.label()} | " + " | ".join(cells) + " |\n")
        out.write("\n")
    return out.getvalue()


STYLE = {
    "none": ("black", ":"), "once": ("tab:blue", "-"), "full": ("tab:cyan", "-"),
    "lirs-page": ("tab:purple", "-"), "corgipile-1%": ("#fdae6b", "-"), "corgipile-2%": ("#f16913", "-"),
    "corgipile-10%": ("#a63603", "-"), "block": ("tab:green", "--"), "window-10%": ("tab:red", "--"),
    "pls-q0": ("tab:olive", "-."), "pls-q0.1": ("tab:brown", "-."), "pls-q0.3": ("tab:pink", "-."),
    # stratified: corgipile's colour at the same buffer, dashed; default: the mount with no options
    "stratified-1%": ("#fdae6b", "--"), "stratified-2%": ("#f16913", "--"), "stratified-10%": ("#a63603", "--"),
    "default": ("black", "-"),
}


Panels = dict[tuple[str, str], dict[str, dict[str, list[float]]]]
"""(dataset, format) -> strategy label -> model -> test accuracy per epoch."""


def panels_of(runs: Sequence[Run]) -> Panels:
    out: Panels = {}
    for r in runs:
        out.setdefault((r.dataset, r.fmt), {})[r.variant.label] = {m: c.test for m, c in r.curves.items()}
    return out


def read_panels(curves_csv: Path) -> Panels:
    """The curves a previous run wrote, to draw them again."""
    out: Panels = {}
    with open(curves_csv, newline="") as f:
        for row in csv.DictReader(f):
            acc = out.setdefault((row["dataset"], row["format"]), {}).setdefault(row["strategy"], {})
            acc.setdefault(row["model"], []).append(float(row["test_acc"]))
    return out


def plot(panels: Panels, path: Path, zoom: bool = False) -> None:
    """Test accuracy per epoch: one row per dataset and format, one column per model.

    ``zoom`` narrows each panel to the band just below the best curves, where shuffles that
    almost match a full shuffle differ; curves far below leave the panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(m for g in panels.values() for c in g.values() for m in c))
    fig, axes = plt.subplots(len(panels), len(models), figsize=(5.2 * len(models), 3.6 * len(panels)),
                             squeeze=False, constrained_layout=True)
    handles = {}
    for row, ((ds, fmt), curves) in enumerate(panels.items()):
        for col, m in enumerate(models):
            ax = axes[row][col]
            tops = []
            for label, by_model in curves.items():
                if m not in by_model:
                    continue
                acc = np.array(by_model[m]) * 100
                color, ls = STYLE.get(label, (None, "-"))
                (h,) = ax.plot(np.arange(1, len(acc) + 1), acc, color=color, ls=ls, lw=1.6,
                               marker="o" if len(acc) <= 10 else None, ms=3, label=label)
                handles.setdefault(label, h)
                tops.append(acc[len(acc) // 2:].max())
            title = f"{ds} ({fmt}): {MODEL_TITLES.get(m, m)}"
            if zoom and tops:
                best = max(tops)
                ax.set_ylim(best - 6, best + 1)
                title += ", zoomed"
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("epoch")
            ax.set_ylabel("test accuracy, %")
            ax.grid(alpha=0.3)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=min(len(handles), 6),
               fontsize=9, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    # a 128-colour palette keeps the picture as it is at a quarter of the bytes
    Image.open(buf).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def plot_all(panels: Panels, out: Path) -> None:
    plot(panels, out / "accuracy.png")
    plot(panels, out / "accuracy-zoom.png", zoom=True)


# --------------------------------------------------------------------------- main


def parse_list(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="digits only, few epochs and strategies (~1 minute)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="synthetic training rows (default 1000000)")
    ap.add_argument("--epochs", type=int, help="epochs for every dataset (default: digits 30, synthetic 8)")
    ap.add_argument("--blocks", type=int, help="target blocks per training file (default: digits 200, synthetic 1000)")
    ap.add_argument("--out", type=Path, default=Path("convergence-results"), help="results directory")
    ap.add_argument("--strategies", help="comma-separated labels or strategy names (default: all)")
    ap.add_argument("--models", help=f"comma-separated, of {','.join(MODELS)}")
    ap.add_argument("--datasets", help="comma-separated, of digits,synthetic")
    ap.add_argument("--formats", help=f"comma-separated, of {','.join(FORMATS)}")
    ap.add_argument("--seed", type=int, default=0, help="seed of the data split, the mounts and the models")
    ap.add_argument("--replot", action="store_true", help="only draw the PNGs again from --out's curves.csv")
    ap.add_argument("--work", type=Path, help="keep the generated files here and reuse them (default: a temporary directory)")
    args = ap.parse_args(argv)
    if args.replot:
        plot_all(read_panels(args.out / "curves.csv"), args.out)
        return 0

    datasets = parse_list(args.datasets) or (["digits"] if args.quick else ["digits", "synthetic"])
    models = parse_list(args.models) or list(MODELS)
    formats = parse_list(args.formats) or list(FORMATS)
    names = parse_list(args.strategies) or (["none", "once", "corgipile-10%", "stratified-10%", "block", "window-10%", "default"] if args.quick else None)
    for what, got, known in (("dataset", datasets, HYPER), ("model", models, MODELS), ("format", formats, FORMATS)):
        if bad := [x for x in got if x not in known]:
            ap.error(f"unknown {what} {bad}; known: {list(known)}")
    variants, notes = select_variants(names)
    for n in notes:
        print(f"note: {n}", flush=True)

    work = args.work or Path(tempfile.mkdtemp(prefix="shufflefs-convergence-"))
    for d in ("data", "cache", "mnt", "logs"):
        (work / d).mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    runs: list[Run] = []
    try:
        for ds in datasets:
            hyper = HYPER[ds]
            epochs = args.epochs or (8 if args.quick else hyper.epochs)
            t0 = time.perf_counter()
            data = load_data(ds, args.rows, args.seed)
            print(f"{ds}: {len(data.y_train)} train rows sorted by label, {len(data.y_test)} test rows, "
                  f"{data.dim} features, {data.n_classes} classes ({time.perf_counter() - t0:.1f}s)", flush=True)
            for fmt in formats:
                t0 = time.perf_counter()
                stored = store(data, fmt, work / "data", args.blocks or hyper.blocks)
                size = (stored.src / stored.file).stat().st_size
                print(f"  {fmt}: {size / 1e6:.1f} MB, block size {stored.block_size} B, {stored.blocks} blocks "
                      f"({time.perf_counter() - t0:.1f}s)", flush=True)
                for v in variants:
                    print(f"  {ds}/{fmt} {v.label}: {epochs} epochs", flush=True)
                    run = run_variant(stored, v, models, hyper, epochs, args.seed, work,
                                      lambda s: print(s, flush=True))
                    runs.append(run)
                    print(f"  {ds}/{fmt} {v.label}: {run.seconds:.1f}s", flush=True)
                    write_results(runs, args.out, notes)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if runs:
        write_results(runs, args.out, notes)
        plot_all(panels_of(runs), args.out)
        print()
        print(markdown_table(runs))
        print(f"wrote {args.out}/results.csv, results.md, curves.csv, accuracy.png, accuracy-zoom.png")
    print(f"wall time {time.perf_counter() - t_start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
