"""The models trained side by side on the batches a view gives, and one variant's training run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .data import Data, Stored
from .mounts import Reader, view_reader
from .settings import Hyper, Variant

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
