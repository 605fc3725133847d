"""results.csv, results.md, curves.csv and the accuracy plots of a run."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

import numpy as np

from .models import Run
from .settings import MODEL_TITLES

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
