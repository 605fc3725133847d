"""Pictures of orders, after the CorgiPile paper's Figs. 3 and 4: one row per strategy, the source
record id of every output position on the left, label counts per bin of output records on the
right.  Needs matplotlib (the ``plot`` extra); it is imported only when a picture is drawn, and
through its object API, so no global backend is chosen for the caller.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

MAX_POINTS = 20_000
"""Scatter at most this many points per panel (evenly spaced output positions): enough to show the
structure, small enough for a PNG of a few hundred KB."""


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("drawing pictures needs matplotlib (pip install 'shufflefs[plot]')") from None
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _label_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "turbo"]
    if n > 20:
        return [cmap(i / max(1, n - 1)) for i in range(n)]
    return [cmap(i) for i in range(n)]


def plot_orders(
    orders: Mapping[str, np.ndarray],
    out: str | os.PathLike,
    labels: np.ndarray | None = None,
    label_names: Sequence[str] | None = None,
    bin_size: int = 20,
    head: int = 500,
    title: str | None = None,
    subtitles: Mapping[str, str] | None = None,
) -> None:
    """Write one PNG: a row per order, "record id vs output position" (Fig. 3) and, with
    ``labels`` (int codes per record id), stacked label counts per ``bin_size`` output records over
    the first ``head`` records (Fig. 4)."""
    if not orders:
        raise ValueError("no orders to draw")
    names = list(orders)
    with_labels = labels is not None
    n_rows = len(names)
    fig = _figure(12.0 if with_labels else 6.5, 0.6 + 2.0 * n_rows)
    axes = fig.subplots(n_rows, 2 if with_labels else 1, squeeze=False)
    if title:
        fig.suptitle(title, fontsize=12)

    n_labels = 0
    colors: list = []
    if with_labels:
        labels = np.asarray(labels, dtype=np.int64)
        n_labels = int(labels.max()) + 1 if len(labels) else 0
        colors = _label_colors(n_labels)
        if label_names is None:
            label_names = [str(i) for i in range(n_labels)]

    for row, name in enumerate(names):
        order = np.asarray(orders[name], dtype=np.int64)
        m = len(order)
        heading = name + (f" ({subtitles[name]})" if subtitles and subtitles.get(name) else "")
        ax = axes[row][0]
        pos = np.unique(np.linspace(0, m - 1, min(m, MAX_POINTS)).astype(np.int64)) if m else np.zeros(0, np.int64)
        ax.scatter(pos, order[pos], s=1.5, c="tab:blue", marker=".", linewidths=0, rasterized=True)
        ax.set_xlim(0, max(m - 1, 1))
        ax.set_ylim(0, max(int(order.max()) if m else 1, 1))
        ax.set_title(f"{heading}: source record id by output position", fontsize=9, loc="left")
        ax.set_ylabel("source record id", fontsize=8)
        ax.tick_params(labelsize=7)
        if row == n_rows - 1:
            ax.set_xlabel("output position (i-th record read)", fontsize=8)

        if not with_labels:
            continue
        ax = axes[row][1]
        shown = order[: min(head, m)]
        bins = (len(shown) + bin_size - 1) // bin_size
        table = np.zeros((bins, n_labels), np.int64)
        if len(shown):
            np.add.at(table, (np.arange(len(shown)) // bin_size, labels[shown]), 1)
        x = np.arange(bins) * bin_size
        bottom = np.zeros(bins, np.int64)
        for lab in range(n_labels):
            ax.bar(x, table[:, lab], width=bin_size * 0.9, bottom=bottom, align="edge",
                   color=colors[lab], label=str(label_names[lab]), linewidth=0)
            bottom += table[:, lab]
        ax.set_xlim(0, max(bins * bin_size, 1))
        ax.set_ylim(0, bin_size)
        ax.set_title(f"{name}: labels per {bin_size} records, first {len(shown)} records", fontsize=9, loc="left")
        ax.set_ylabel("records of each label", fontsize=8)
        ax.tick_params(labelsize=7)
        if row == n_rows - 1:
            ax.set_xlabel("output position", fontsize=8)
        if row == 0 and 0 < n_labels <= 20:
            ax.legend(title="label", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      frameon=False, ncols=1)
    fig.savefig(os.fspath(out), dpi=100, pil_kwargs={"optimize": True})
