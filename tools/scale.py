#!/usr/bin/env python3
"""Plans of many ranks for a huge dataset, on paper: per-rank plan time and memory, no mounts, no data.

    python tools/scale.py --node [--help]       (one node's daemon: tools/bench/node.py)
    python tools/scale.py [--world 1024] [--records 1e9] [--block-size 4MiB] [--buffer 64MiB]
                          [--strategies corgipile,block,pls] [--sample 16] [--all-ranks] ...

The dataset is a seeded `BlockSummary` (records of about ``--record-bytes``, a varying number
per block): per-block record counts and bytes only, so a billion records cost a few MiB.  For
each strategy it builds rank r's plan for epoch ``--epoch`` as `make_plan` would in a mount of
that rank, and reports per rank:

* plan time (median, max; timed without tracing) and the traced peak memory while the plan is
  built and what the plan keeps afterwards (tracemalloc, a second pass over the same ranks);
* the cost of expanding one window (the middle one) to record ids.

Strategies whose units are blocks (none, block, corgipile) build every rank; the others (pls)
a sample of ``--sample`` ranks unless ``--all-ranks``.  Every rank's block share is checked:
the shares are disjoint and cover every record exactly once, and the ranks' record counts add up
to the dataset's (exit status 1 otherwise).

Then the scaling evidence, each row from ``--scale-sample`` ranks: (a) the same blocks holding
100x more or fewer records, (b) more, smaller blocks, (c) other world sizes (another share per
rank).  Last, the record-level strategies (full, once, window) at small record counts: their
per-rank order is O(records) (full, once: of the whole dataset), which the rows show growing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shufflefs.config import format_size, parse_size  # noqa: E402
from shufflefs.strategies import LOCAL_MODES, STRATEGIES, ShuffleSpec, make_plan  # noqa: E402
from shufflefs.strategies.partial_local import PartialLocalPlan  # noqa: E402
from shufflefs.strategies.summary import BlockSummary  # noqa: E402
from shufflefs.strategies.units import UnitPlan  # noqa: E402

MiB = 1 << 20
SUMMARY_LEVEL = ("none", "block", "corgipile", "pls")
"""Strategies whose plans a block summary can make (lirs-page needs page units: the record index)."""
RECORD_LEVEL = ("full", "once", "window")
NOT_MEASURED = {
    "balance": "sorts every record's cost (full + --balance): O(records) input and order on every rank",
    "lirs-page": "its units are pages, which a block summary does not describe (O(pages) with the record index)",
}


def count(text: str) -> int:
    """``1e9``, ``1_000_000`` or ``250000`` as an int."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return int(value)


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def listing(item):
    def parse(text: str) -> list:
        return [item(t.strip()) for t in text.split(",") if t.strip()]
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Sizes take units (4MiB, 64KiB); counts take 1e9 or 1_000_000.")
    p.add_argument("--world", type=count, default=1024, help="ranks (default 1024)")
    p.add_argument("--records", type=count, default=10**9, help="records of the dataset (default 1e9)")
    p.add_argument("--record-bytes", type=size, default=1024, help="mean record size (default 1KiB)")
    p.add_argument("--spread", type=float, default=0.25, help="records per block vary by up to this fraction (default 0.25)")
    p.add_argument("--block-size", type=size, default=4 * MiB, help="default 4MiB")
    p.add_argument("--buffer", type=size, default=64 * MiB, help="default 64MiB")
    p.add_argument("--strategies", type=listing(str), default=["corgipile", "block", "pls"],
                   help=f"comma-separated, of {', '.join(SUMMARY_LEVEL)} (default corgipile,block,pls)")
    p.add_argument("--epoch", type=count, default=1, help="epoch planned (default 1: pls has exchanged once)")
    p.add_argument("--exchange", type=float, default=0.1, help="pls: fraction exchanged before each epoch (default 0.1)")
    p.add_argument("--pls-local", choices=LOCAL_MODES, default="uniform", help="pls: how a rank shuffles its partition")
    p.add_argument("--seed", type=count, default=0)
    p.add_argument("--sample", type=count, default=16,
                   help="ranks built for strategies whose plans cost O(share records), i.e. pls (default 16)")
    p.add_argument("--all-ranks", action="store_true", help="build every rank's plan for every strategy")
    p.add_argument("--scale-sample", type=count, default=3, help="ranks built per scaling row (default 3)")
    p.add_argument("--scale-records", type=listing(count), default=[10**8, 10**9, 10**10],
                   help="(a) record counts in the same blocks (default 1e8,1e9,1e10; empty to skip)")
    p.add_argument("--scale-blocks", type=listing(size), default=[16 * MiB, 4 * MiB, MiB, MiB // 4],
                   help="(b) block sizes for the same records (default 16MiB,4MiB,1MiB,256KiB)")
    p.add_argument("--scale-worlds", type=listing(count), default=[256, 1024, 4096],
                   help="(c) world sizes (default 256,1024,4096)")
    p.add_argument("--record-level", type=listing(count), default=[5 * 10**5, 2 * 10**6, 8 * 10**6],
                   help="record counts for full, once and window (default 5e5,2e6,8e6; empty to skip)")
    a = p.parse_args(argv)
    bad = [s for s in a.strategies if s not in SUMMARY_LEVEL]
    if bad:
        p.error(f"a block summary plans {', '.join(SUMMARY_LEVEL)}, not {', '.join(bad)}"
                + "".join(f"\n  {s}: {NOT_MEASURED[s]}" for s in bad if s in NOT_MEASURED))
    if a.world < 1 or a.records < 1:
        p.error("need at least one rank and one record")
    if not 0.0 <= a.exchange <= 1.0:
        p.error("--exchange must be in [0, 1]")
    return a


# --------------------------------------------------------------------------- measuring


def sample_ranks(world: int, k: int) -> np.ndarray:
    """``k`` ranks spread over the world, first and last included (all of them if k >= world)."""
    if k <= 0 or k >= world:
        return np.arange(world)
    return np.unique(np.linspace(0, world - 1, k).round().astype(np.int64))


def stream_ranges(firsts: np.ndarray, order: np.ndarray, a: int, b: int) -> np.ndarray:
    """Record ranges ``[lo, hi)`` (int64[k, 2]) of stream positions ``[a, b)`` of the units in
    ``order``: whole units but perhaps the first and the last."""
    per_unit = np.concatenate(([0], np.cumsum(np.diff(firsts)[order]))).astype(np.int64)
    k0 = int(np.searchsorted(per_unit, a, side="right")) - 1
    k1 = int(np.searchsorted(per_unit, b, side="left"))
    units = order[k0:k1] if b > a else order[:0]
    out = np.stack([firsts[units], firsts[units + 1]], axis=1).astype(np.int64)
    if len(out):
        out[0, 0] += a - per_unit[k0]
        out[-1, 1] -= per_unit[k1] - b
    return out


def pls_ranges(ex, rank: int) -> np.ndarray:
    return stream_ranges(ex.firsts, ex.unit_order, int(ex.starts[rank]), int(ex.starts[rank + 1]))


def block_share(plan) -> np.ndarray:
    """The record ranges a rank's plan was given (int64[k, 2]): its units' (the first and last
    perhaps cut), or for pls its epoch-0 partition's."""
    if isinstance(plan, UnitPlan):
        return np.stack([plan.lo, plan.hi], axis=1)
    if isinstance(plan, PartialLocalPlan):
        return pls_ranges(plan.exchange, plan.rank)
    raise TypeError(f"{plan.name} plans have no block share")


def plan_records(plan) -> int:
    return int(plan.record_cuts[-1])


@dataclass
class Measured:
    """Per-rank figures of one strategy on one dataset (arrays over the ranks built)."""

    ranks: np.ndarray
    seconds: np.ndarray
    peak: np.ndarray
    kept: np.ndarray
    window_seconds: np.ndarray
    window_records: np.ndarray
    share_blocks: np.ndarray
    share_records: np.ndarray
    shares: list
    unit_order: np.ndarray | None
    """pls: the exchange's block order, which every rank built must have drawn alike."""
    exchange: object | None
    counts: np.ndarray | None
    """Every rank's record count as the plans see it (the first plan's ``rank_counts``)."""
    problems: list


_warm: set[str] = set()


def measure(index, spec: ShuffleSpec, epoch: int, world: int, ranks: np.ndarray, check: bool = False) -> Measured:
    """Build ``ranks``' plans twice: timed (plus one window expanded), then traced for memory."""
    if spec.strategy not in _warm:  # the first plan of a kind pays for imports and first-call caches
        make_plan(index, spec, epoch, int(ranks[0]), world)
        _warm.add(spec.strategy)
    gc.collect()
    n = len(ranks)
    secs, wsecs, wrecs = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    sblocks, srecs = np.zeros(n, np.int64), np.zeros(n, np.int64)
    shares, problems, counts, unit_order, exchange = [], [], None, None, None
    for i, r in enumerate(ranks.tolist()):
        t0 = time.perf_counter()
        plan = make_plan(index, spec, epoch, r, world)
        secs[i] = time.perf_counter() - t0
        if plan.n_windows:
            k = plan.n_windows // 2
            t0 = time.perf_counter()
            ids = plan.window(k)
            wsecs[i] = time.perf_counter() - t0
            wrecs[i] = len(ids)
            del ids
        srecs[i] = plan_records(plan)
        if counts is None:
            counts = np.asarray(plan.rank_counts, dtype=np.int64)
        elif not np.array_equal(counts, plan.rank_counts):
            problems.append(f"rank {r} sees other rank record counts than rank {ranks[0]}")
        if srecs[i] != counts[r]:
            problems.append(f"rank {r}'s plan holds {srecs[i]} records, its count says {counts[r]}")
        if hasattr(plan, "units") or isinstance(plan, PartialLocalPlan):
            sh = block_share(plan)
            sblocks[i] = len(sh)
            if check:
                shares.append(sh.copy())
        if check and isinstance(plan, PartialLocalPlan):
            if unit_order is None:
                unit_order = np.asarray(plan.exchange.unit_order)
                exchange = plan.exchange
            elif not np.array_equal(unit_order, plan.exchange.unit_order):
                problems.append(f"rank {r} drew another block order than rank {ranks[0]}")
            order = np.asarray(plan.order)
            if len(order) and (order.min() < 0 or order.max() >= index.n or len(np.unique(order)) != len(order)):
                problems.append(f"rank {r}'s pls order repeats a record or leaves 0..n-1")
        del plan
    peaks, kept = np.zeros(n, np.int64), np.zeros(n, np.int64)
    gc.collect()
    gc.disable()  # plans hold no reference cycles: each is freed by `del`, and no collection runs mid-trace
    tracemalloc.start()
    try:
        for i, r in enumerate(ranks.tolist()):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            plan = make_plan(index, spec, epoch, r, world)
            now, peak = tracemalloc.get_traced_memory()
            peaks[i], kept[i] = peak - base, now - base
            del plan
    finally:
        tracemalloc.stop()
        gc.enable()
    return Measured(ranks, secs, peaks, kept, wsecs, wrecs, sblocks, srecs, shares, unit_order, exchange, counts, problems)


def cover_problems(m: Measured, blocks: int, n: int, world: int) -> list[str]:
    """The ranks' shares (record ranges) are disjoint and cover every record once; their counts add up to n."""
    out = list(m.problems)
    if m.counts is None or int(m.counts.sum()) != n or len(m.counts) != world:
        out.append(f"the ranks' record counts add up to {None if m.counts is None else int(m.counts.sum())}, not {n}")
    shares = m.shares
    if len(shares) != world and m.exchange is not None:
        # pls ranks not built: their epoch-0 shares from the exchange all built ranks agree on
        shares = [pls_ranges(m.exchange, r) for r in range(world)]
    if len(shares) == world:
        ranges = np.concatenate(shares) if shares else np.zeros((0, 2), np.int64)
        ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
        overlap = int((ranges[1:, 0] < ranges[:-1, 1]).sum())
        covered = int((ranges[:, 1] - ranges[:, 0]).sum())
        if overlap or covered != n:
            out.append(f"shares: {overlap} ranges given to more than one rank, {covered} of {n} records covered")
    return out


# --------------------------------------------------------------------------- printing


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x < 10 else f"{x * 1e3:.0f}"


def mib(x: float) -> str:
    return f"{x / MiB:.2f}" if x < 100 * MiB else f"{x / MiB:.0f}"


def binary(x: float) -> str:
    for unit, f in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if x >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.0f} B"


def big(x: float) -> str:
    x = float(x)
    for unit, f in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= f:
            return f"{x / f:.3g}{unit}"
    return f"{x:.0f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


COLUMNS = ["ranks built", "share blocks", "share records", "plan ms med", "plan ms max", "peak MiB med", "peak MiB max",
           "kept MiB med", "window ms", "window records"]


def cells(m: Measured) -> list[str]:
    med = np.median
    return [str(len(m.ranks)), big(med(m.share_blocks)), big(med(m.share_records)), ms(med(m.seconds)), ms(m.seconds.max()),
            mib(med(m.peak)), mib(m.peak.max()), mib(med(m.kept)), ms(med(m.window_seconds)), big(med(m.window_records))]


def growth(values: list[float]) -> list[str]:
    return [f"x{v / values[0]:.2f}" if values[0] > 0 else "-" for v in values]


# --------------------------------------------------------------------------- the run


def scaling(a: argparse.Namespace, base: ShuffleSpec, label: str, settings: list, title: str, note: str) -> None:
    """One table: every strategy under every setting ``(label value, build the dataset, world)``,
    from ``--scale-sample`` ranks each; plan time relative to the first setting."""
    datasets, skipped = [], []
    for value, build, world in settings:
        try:
            datasets.append((value, build(), world))
        except ValueError as e:
            skipped.append(f"{label} {value}: {e}")
    rows = []
    for name in a.strategies:
        res = []
        for value, d, world in datasets:
            spec = replace(base, strategy=name, block_size=d.block_size)
            res.append(measure(d, spec, a.epoch, world, sample_ranks(world, a.scale_sample)))
        for (value, d, _), m, x in zip(datasets, res, growth([float(np.median(m.seconds)) for m in res])):
            rows.append([name, value, big(d.blocks), *cells(m)[1:], x])
    print(title)
    print(table(["strategy", label, "blocks", *COLUMNS[1:], "plan time vs first"], rows))
    print(f"  {note}")
    for line in skipped:
        print(f"  skipped {line}")
    print()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--node"]:  # one node's daemon, measured here and projected (tools/bench/node.py)
        sys.path.insert(0, str(REPO / "tools"))
        from bench import node
        node.main(argv[1:])
        return 0
    a = parse_args(argv)
    started = time.perf_counter()
    base = ShuffleSpec(seed=a.seed, block_size=a.block_size, buffer=a.buffer, exchange=a.exchange, pls_local=a.pls_local)
    t0 = time.perf_counter()
    try:
        data = BlockSummary.synthetic(a.records, a.block_size, a.record_bytes, a.spread, a.seed)
    except ValueError as e:
        print(f"scale.py: {e}", file=sys.stderr)
        return 2
    built = time.perf_counter() - t0
    print(f"dataset: {big(data.n)} records, {binary(data.data_bytes)} of records in {big(data.blocks)} blocks of "
          f"{format_size(a.block_size)} ({big(data.block_records.min())}..{big(data.block_records.max())} records "
          f"per block); its block summary: {mib(data.nbytes)} MiB, built in {ms(built)} ms")
    print(f"plans: world {a.world}, epoch {a.epoch}, buffer {format_size(a.buffer)}, seed {a.seed}, "
          f"pls exchange {a.exchange}, pls local shuffle {a.pls_local}\n")

    failures: list[str] = []
    rows = []
    for name in a.strategies:
        spec = replace(base, strategy=name)
        every = a.all_ranks or issubclass(STRATEGIES[name], UnitPlan)
        ranks = sample_ranks(a.world, 0 if every else a.sample)
        m = measure(data, spec, a.epoch, a.world, ranks, check=True)
        probs = cover_problems(m, data.blocks, data.n, a.world)
        failures += [f"{name}: {p}" for p in probs]
        note = "FAILED" if probs else ("disjoint, cover all" if len(m.shares) == a.world else "disjoint, cover all (*)")
        rows.append([name, *cells(m), note])
    print(f"per-rank plans ({big(data.n)} records, world {a.world}); share = the rank's blocks and records; "
          "peak/kept = traced bytes while building / held by the plan")
    print(table(["strategy", *COLUMNS, "shares"], rows))
    print("  shares are cut at equal record counts (a block at a cut is split between two ranks).  pls builds a"
          " sample of ranks (its plan is O(share records)); --all-ranks builds all of them. Its shares are the"
          " epoch-0 partitions;\n  (*) the ranks not built are checked from the exchange every built rank"
          " drew alike\n")

    synth = lambda n, bs=a.block_size, blocks=None: BlockSummary.synthetic(  # noqa: E731
        n, bs, a.record_bytes, a.spread, a.seed, blocks=blocks)
    if a.scale_records:
        scaling(a, base, "records", [(big(n), lambda n=n: synth(n, blocks=data.blocks), a.world) for n in a.scale_records],
                f"(a) the same {big(data.blocks)} blocks, records per block varied (world {a.world})",
                "block plans stay flat while the records grow; pls (share records) and the window expansion "
                "(a window's records) grow with them")
    if a.scale_blocks:
        scaling(a, base, "block", [(format_size(bs), lambda bs=bs: synth(a.records, bs), a.world) for bs in a.scale_blocks],
                f"(b) {big(data.n)} records in smaller blocks (world {a.world})",
                "every plan draws the permutation of all blocks: O(blocks) per rank")
    if a.scale_worlds:
        scaling(a, base, "world", [(str(w), lambda: data, w) for w in a.scale_worlds],
                f"(c) world size varied ({big(data.n)} records, {big(data.blocks)} blocks)",
                "the share shrinks with the world: pls follows it; block plans keep their O(blocks) floor")
    if a.record_level:
        rows = []
        for name in RECORD_LEVEL:
            spec = replace(base, strategy=name)
            res = []
            for n in a.record_level:
                try:
                    d = synth(n)
                except ValueError as e:
                    print(f"  skipped {name} at {big(n)} records: {e}")
                    continue
                res.append((d, measure(d, spec, a.epoch, a.world, sample_ranks(a.world, min(a.scale_sample, 2)))))
            g = growth([float(np.median(m.seconds)) for _, m in res])
            for (d, m), x in zip(res, g):
                c = cells(m)
                per = float(np.median(m.peak)) / d.n
                rows.append([name, big(d.n), c[0], c[2], c[3], c[5], f"{per:.2f}", x])
        print(f"record-level strategies at small record counts (world {a.world}): their plans are O(records), "
              "not O(blocks), so they are left out above")
        print(table(["strategy", "records", "ranks built", "share records", "plan ms med", "peak MiB med",
                     "peak B / dataset record", "plan time vs first"], rows))
        print("  full and once permute all records on every rank (O(records) time and memory per rank, whatever"
              " the world); window orders its share of records (O(records / world))")
        for name, why in NOT_MEASURED.items():
            print(f"  not measured: {name}: {why}")
        print()

    print(f"total {time.perf_counter() - started:.1f} s")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("check passed: every strategy's shares are disjoint and cover every record exactly once; "
          "record counts add up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
