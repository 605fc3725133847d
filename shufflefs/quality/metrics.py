"""How well an order is shuffled, measured on the order itself (int64 source record ids in output
order, e.g. the windows of a `Plan` concatenated).

Each metric answers one question a training run cares about:

- `rank_correlation`: does the output still follow the source order? (1 unshuffled, -1 reversed,
  about 0 for a random order)
- `label_mix_tv`: does each stretch of k records carry the dataset's label mix, or runs of one
  label (what hurts SGD on clustered data)?  0 is a perfect mix.
- `gap_entropy`: MosaicML Streaming's shuffle-quality measure, the entropy of the distribution of
  distances between successive source ids, so figures compare with theirs.
- `same_block_pairs`: how often two records of one batch come from the same source block, the
  correlation block-based strategies trade for sequential reads.

The reference is a uniform permutation of the same records: measured on a seeded draw
(`uniform_reference`) and, where it has a closed form, as the exact expectation
(`uniform_expectation`).  Everything is vectorised numpy; nothing here loops over records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

I64 = np.int64

RANK_CORR = "rank_corr"
LABEL_TV = "label_tv"
GAP_ENTROPY = "gap_entropy"
BLOCK_GAP_ENTROPY = "block_gap_entropy"
SAME_BLOCK = "same_block"
METRICS = (RANK_CORR, LABEL_TV, GAP_ENTROPY, BLOCK_GAP_ENTROPY, SAME_BLOCK)

UNIFORM = "uniform"
EXPECTED = "expected"


def _ids(order: np.ndarray) -> np.ndarray:
    a = np.asarray(order)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError("an order is a 1-d array of integer record ids")
    return a.astype(I64, copy=False)


# --------------------------------------------------------------------------- metrics


def rank_correlation(order: np.ndarray) -> float:
    """Spearman correlation between source position and output position (NaN below 2 records).

    Record ids are distinct, so ranks have no ties and rho = 1 - 6 sum d^2 / (m (m^2 - 1)).
    Ids need not be 0..m-1 (a rank's share is a subset): they are ranked first.
    """
    ids = _ids(order)
    m = len(ids)
    if m < 2:
        return float("nan")
    ranks = np.empty(m, I64)
    ranks[np.argsort(ids, kind="stable")] = np.arange(m, dtype=I64)
    d = (ranks - np.arange(m, dtype=I64)).astype(np.float64)
    return float(1.0 - 6.0 * float(np.dot(d, d)) / (m * (m * m - 1.0)))


def label_mix_tv(order: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Mean over consecutive windows of k output records of the total variation distance between
    the window's label histogram and the histogram of the whole order.

    Only full windows count (a short tail would add noise, not information), unless the order is
    shorter than k, which then is one window.  0 means every window has the global mix; label-
    sorted data read in order scores close to 1 - 1/L for L balanced labels.  Counts come from
    one sort of ``window * L + label`` keys, so memory stays O(records) for any number of labels.
    """
    if k < 1:
        raise ValueError(f"window size must be >= 1, got {k}")
    ids = _ids(order)
    lab = np.asarray(labels)[ids]
    m = len(lab)
    if m == 0:
        return float("nan")
    codes, lab = np.unique(lab, return_inverse=True)
    lab = lab.astype(I64, copy=False).reshape(-1)
    n_labels = len(codes)
    p = np.bincount(lab, minlength=n_labels) / m
    if m >= k:
        windows, size = m // k, k
        lab = lab[: windows * k]
    else:
        windows, size = 1, m
    keys = (np.arange(len(lab), dtype=I64) // size) * n_labels + lab
    present, counts = np.unique(keys, return_counts=True)
    label_of = present % n_labels
    # TV = 1/2 (sum over labels in the window |c/size - p| + sum over absent labels p)
    #    = 1/2 (1 + sum over labels in the window (|c/size - p| - p))
    inside = np.abs(counts / size - p[label_of]) - p[label_of]
    return float(0.5 * (windows + inside.sum()) / windows)


def gap_entropy(order: np.ndarray) -> float:
    """Entropy in bits of the distribution of |order[i+1] - order[i]|, as MosaicML Streaming's
    shuffle-quality scripts compute it (0 for source or reverse order: every gap is 1).

    The plug-in estimate from m-1 gaps; it grows with the number of records, so compare a
    strategy only with the uniform reference of the same records.
    """
    ids = _ids(order)
    if len(ids) < 2:
        return 0.0
    gaps = np.abs(np.diff(ids))
    counts = np.bincount(gaps)
    counts = counts[counts > 0]
    p = counts / (len(ids) - 1)
    return float(-(p * np.log2(p)).sum()) + 0.0  # + 0.0: no "-0.0" for a single gap size


def same_block_pairs(order: np.ndarray, block_of_record: np.ndarray, batch: int) -> float:
    """Fraction of the record pairs inside each batch of ``batch`` output records whose two
    records share a source block: sum over batches and blocks of c(c-1)/2 over all in-batch pairs.

    The last batch may be short and counts with its own pairs.  Counted by sorting
    ``batch * blocks + block`` keys: a dense batches x blocks table would not fit for large files.
    """
    if batch < 1:
        raise ValueError(f"batch size must be >= 1, got {batch}")
    ids = _ids(order)
    m = len(ids)
    full, rest = divmod(m, batch)
    total = full * (batch * (batch - 1) // 2) + rest * (rest - 1) // 2
    if total == 0:
        return float("nan")
    blocks = np.asarray(block_of_record, dtype=I64)[ids]
    n_blocks = int(blocks.max()) + 1
    keys = (np.arange(m, dtype=I64) // batch) * n_blocks + blocks
    _, counts = np.unique(keys, return_counts=True)
    same = int((counts * (counts - 1) // 2).sum())
    return same / total


def block_of_records(bounds: np.ndarray, block_size: int) -> np.ndarray:
    """Source block (of ``block_size`` bytes, numbered from 0) of every record, as strategies
    define it: the block holding the record's first byte, empty blocks skipped."""
    from ..index.table import unit_firsts

    firsts = unit_firsts(np.asarray(bounds, dtype=I64), int(block_size))
    return np.repeat(np.arange(len(firsts) - 1, dtype=I64), np.diff(firsts))


# --------------------------------------------------------------------------- the uniform reference


def measure(
    order: np.ndarray,
    labels: np.ndarray | None = None,
    block_of_record: np.ndarray | None = None,
    k: int = 100,
    batch: int = 32,
) -> dict[str, float]:
    """Every metric the inputs allow, keyed by the names in `METRICS`."""
    out = {RANK_CORR: rank_correlation(order), GAP_ENTROPY: gap_entropy(order)}
    if labels is not None:
        out[LABEL_TV] = label_mix_tv(order, labels, k)
    if block_of_record is not None:
        out[BLOCK_GAP_ENTROPY] = gap_entropy(np.asarray(block_of_record, dtype=I64)[_ids(order)])
        out[SAME_BLOCK] = same_block_pairs(order, block_of_record, batch)
    return {key: out[key] for key in METRICS if key in out}


def uniform_reference(
    n: int | np.ndarray,
    labels: np.ndarray | None = None,
    block_of_record: np.ndarray | None = None,
    k: int = 100,
    batch: int = 32,
    seed: int = 0,
) -> dict[str, float]:
    """The metrics of a seeded uniform permutation of records ``0..n-1`` (or of the ids ``n``)."""
    ids = np.arange(n, dtype=I64) if np.ndim(n) == 0 else _ids(n)
    perm = np.random.default_rng(seed).permutation(ids)
    return measure(perm, labels, block_of_record, k, batch)


def expected_label_mix_tv(label_counts: Sequence[int] | np.ndarray, k: int) -> float:
    """Exact expected `label_mix_tv` of a uniform permutation (full windows of k records).

    A window of a uniform permutation is k records drawn without replacement, so each label's
    count in it is hypergeometric; TV is half the sum of the expected absolute deviations.
    """
    counts = np.asarray(label_counts, dtype=I64)
    n = int(counts.sum())
    if n == 0:
        return float("nan")
    k = min(k, n)
    lg = np.frompyfunc(math.lgamma, 1, 1)

    def log_comb(a: np.ndarray | int, b: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        return np.asarray(lg(a + 1) - lg(b + 1) - lg(a - b + 1), dtype=np.float64)

    total = 0.0
    for K in counts.tolist():  # one term per label, not per record
        x = np.arange(max(0, k - (n - K)), min(k, K) + 1, dtype=np.float64)
        logp = log_comb(K, x) + log_comb(n - K, k - x) - float(log_comb(n, np.float64(k)))
        total += float(np.dot(np.exp(logp), np.abs(x / k - K / n)))
    return 0.5 * total


def expected_block_mix_tv(blocks: int, labels: int = 10) -> float:
    """Expected `label_mix_tv` of a buffer of ``blocks`` single-label blocks, each of one of
    ``labels`` equally common labels drawn uniformly (a fully label-sorted file of many more
    blocks than a buffer holds; drawing without replacement only mixes better).

    The label counts are multinomial(n, 1/L), so E[TV] = L/2 E|X/n - 1/L| with X ~ Bin(n, 1/L),
    and de Moivre's mean absolute deviation gives it exactly:
    E[TV] = (L v / n) C(n, v) p^v (1-p)^(n-v+1), p = 1/L, v = floor(n/L) + 1;
    about sqrt((L-1) / (2 pi n)) for large n.
    """
    n, L = int(blocks), int(labels)
    if n < 1 or L < 1:
        raise ValueError(f"blocks and labels must be >= 1, got {blocks} and {labels}")
    v = n // L + 1
    if v > n:  # one label: every window has the file's mix
        return 0.0
    p = 1.0 / L
    log_term = (math.lgamma(n + 1) - math.lgamma(v + 1) - math.lgamma(n - v + 1)
                + v * math.log(p) + (n - v + 1) * math.log1p(-p))
    return L * v / n * math.exp(log_term)


def expected_stratified_mix_tv(blocks: int, strata: int, labels: int = 10, offsets: int = 16) -> float:
    """Expected `label_mix_tv` of a stratified buffer (`strategies.stratified`) over a fully
    label-sorted file of ``blocks`` one-label blocks (label of block b: ``b * labels // blocks``).

    ``strata``: blocks per buffer.  The buffer takes one uniformly drawn block from each stratum
    of ``ceil(blocks / strata)`` consecutive blocks, so a label's count is a sum of independent
    Bernoulli draws, one per stratum that holds the label in part (a Poisson binomial, computed
    exactly); averaged over ``offsets`` rotations of the strata, as the order rotates them every
    epoch.
    """
    B, S, L = int(blocks), int(strata), int(labels)
    if B < 1 or S < 1 or L < 1:
        raise ValueError(f"blocks, strata and labels must be >= 1, got {blocks}, {strata}, {labels}")
    G = -(-B // S)  # groups; strata of G blocks, as the order cuts them
    if G > 64:  # finer blocks change the strata's label shares by under 1/64 of a block
        B, G = -(-B * 64 // G), 64
    S = -(-B // G)
    label = np.arange(B, dtype=I64) * L // B
    share = np.bincount(label, minlength=L) / B
    edges = np.minimum(np.arange(S + 1, dtype=I64) * G, B)
    total = 0.0
    shifts = sorted({int(o) * B // max(1, offsets) for o in range(max(1, offsets))})
    for shift in shifts:
        rolled = np.roll(label, -shift)
        stratum = np.repeat(np.arange(S, dtype=I64), np.diff(edges))
        p = np.bincount(stratum * L + rolled, minlength=S * L).reshape(S, L) / np.diff(edges)[:, None]
        tv = 0.0
        for lab in range(L):
            q = p[:, lab]
            sure = int(np.sum(q >= 1.0))
            dist = np.ones(1)
            for x in q[(q > 0) & (q < 1)]:
                dist = np.concatenate((dist * (1 - x), [0.0])) + np.concatenate(([0.0], dist * x))
            counts = sure + np.arange(len(dist))
            tv += float(np.sum(dist * np.abs(counts / S - share[lab])))
        total += tv / 2
    return total / len(shifts)


def expected_same_block_pairs(block_of_record: np.ndarray, ids: np.ndarray | None = None) -> float:
    """Exact expected `same_block_pairs` of a uniform permutation, for any batch size: each pair
    of batch positions holds a uniformly random pair of distinct records, so the answer is
    sum over blocks of C(size, 2) / C(records, 2)."""
    blocks = np.asarray(block_of_record, dtype=I64)
    if ids is not None:
        blocks = blocks[_ids(ids)]
    m = len(blocks)
    if m < 2:
        return float("nan")
    sizes = np.bincount(blocks).astype(np.float64)
    return float((sizes * (sizes - 1)).sum() / (m * (m - 1.0)))


def uniform_expectation(
    ids: int | np.ndarray,
    labels: np.ndarray | None = None,
    block_of_record: np.ndarray | None = None,
    k: int = 100,
) -> dict[str, float]:
    """The metrics whose expectation under a uniform permutation has a closed form (gap entropy
    has none: it is a plug-in estimate whose bias depends on the record count)."""
    ids = np.arange(ids, dtype=I64) if np.ndim(ids) == 0 else _ids(ids)
    out = {RANK_CORR: 0.0 if len(ids) >= 2 else float("nan")}
    if labels is not None and len(ids):
        _, lab = np.unique(np.asarray(labels)[ids], return_inverse=True)
        out[LABEL_TV] = expected_label_mix_tv(np.bincount(lab.reshape(-1)), k)
    if block_of_record is not None:
        out[SAME_BLOCK] = expected_same_block_pairs(block_of_record, ids)
    return {key: out[key] for key in METRICS if key in out}


# --------------------------------------------------------------------------- report


@dataclass
class QualityReport:
    """Metrics per named order, plus the uniform reference and its exact expectation."""

    columns: dict[str, dict[str, float]]
    uniform: dict[str, float]
    expected: dict[str, float]
    records: int
    k: int
    batch: int
    labels: list[str] | None = None
    blocks: int | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        def clean(d: Mapping[str, float]) -> dict:
            return {key: (None if isinstance(v, float) and math.isnan(v) else v) for key, v in d.items()}

        return {
            "records": self.records,
            "window": self.k,
            "batch": self.batch,
            "labels": self.labels,
            "blocks": self.blocks,
            "strategies": {name: clean(m) for name, m in self.columns.items()},
            UNIFORM: clean(self.uniform),
            EXPECTED: clean(self.expected),
            **({"notes": self.notes} if self.notes else {}),
        }


def report(
    orders: Mapping[str, np.ndarray],
    labels: np.ndarray | None = None,
    block_of_record: np.ndarray | None = None,
    k: int = 100,
    batch: int = 32,
    label_names: Sequence[str] | None = None,
    seed: int = 0,
) -> QualityReport:
    """Measure every order; the reference permutes the records of the first order (all orders of
    one file and rank hold the same records)."""
    if not orders:
        raise ValueError("no orders to measure")
    columns = {name: measure(o, labels, block_of_record, k, batch) for name, o in orders.items()}
    ids = _ids(next(iter(orders.values())))
    blocks = int(np.asarray(block_of_record)[ids].max()) + 1 if block_of_record is not None and len(ids) else None
    return QualityReport(
        columns=columns,
        uniform=uniform_reference(ids, labels, block_of_record, k, batch, seed),
        expected=uniform_expectation(ids, labels, block_of_record, k),
        records=len(ids),
        k=k,
        batch=batch,
        labels=list(label_names) if label_names is not None else None,
        blocks=blocks,
    )


def metric_titles(k: int, batch: int) -> dict[str, str]:
    return {
        RANK_CORR: "rank correlation, source vs output",
        LABEL_TV: f"label mix TV per {k} records",
        GAP_ENTROPY: "gap entropy, records (bits)",
        BLOCK_GAP_ENTROPY: "gap entropy, blocks (bits)",
        SAME_BLOCK: f"same-block pairs per batch of {batch}",
    }


def _cell(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.3f}"


def format_report(rep: QualityReport) -> str:
    """A plain-text table: one row per metric, one column per order, then the references."""
    names = [*rep.columns, UNIFORM, EXPECTED]
    values = {**rep.columns, UNIFORM: rep.uniform, EXPECTED: rep.expected}
    titles = metric_titles(rep.k, rep.batch)
    rows = [key for key in METRICS if any(key in values[n] for n in names)]
    left = max(len(titles[r]) for r in rows)
    widths = [max(6, len(n)) for n in names]
    out = [" " * left + "  " + "  ".join(n.rjust(w) for n, w in zip(names, widths))]
    for r in rows:
        cells = [_cell(values[n].get(r)) for n in names]
        out.append(titles[r].ljust(left) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    return "\n".join(out)


def format_markdown(rep: QualityReport) -> str:
    """The same table in Markdown, for documentation."""
    names = [*rep.columns, UNIFORM, EXPECTED]
    values = {**rep.columns, UNIFORM: rep.uniform, EXPECTED: rep.expected}
    titles = metric_titles(rep.k, rep.batch)
    rows = [key for key in METRICS if any(key in values[n] for n in names)]
    out = ["| metric | " + " | ".join(f"`{n}`" if n in rep.columns else n for n in names) + " |",
           "|---|" + "---:|" * len(names)]
    for r in rows:
        out.append(f"| {titles[r]} | " + " | ".join(_cell(values[n].get(r)) for n in names) + " |")
    return "\n".join(out)
