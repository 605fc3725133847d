"""What a convergence run trains: the data sets' hyperparameters and the strategy variants
(each a mount's options), and the paths and constants the other modules share."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[3]
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
