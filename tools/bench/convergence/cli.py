"""The command line: which data sets, formats, variants and models, then train and write the
results."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

from .data import load_data, store
from .models import Run, run_variant
from .output import markdown_table, panels_of, plot_all, read_panels, write_results
from .settings import FORMATS, HYPER, MODELS, select_variants

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

