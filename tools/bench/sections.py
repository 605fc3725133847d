"""The sections of ``tools/bench.py`` that run on their own: each makes its own data, takes its own
options and prints (or, with ``--update-docs``, writes) its own part of docs/.  They share no
datasets with the main run, so ``--only NAME`` runs one of them alone and hands it every other
argument: ``python tools/bench.py --only parquet --data DIR --rounds 3``, and
``python tools/bench.py --only parquet --help`` lists that section's options."""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Sequence

# name: (module under bench/, what it measures, where docs/ quotes it)
STANDALONE: dict[str, tuple[str, str]] = {
    "parquet": ("parquet_views", "Parquet views against pyarrow on the source, HF datasets, litdata "
                "(docs/benchmark.md)"),
    "parquet-cold": ("parquet_cold", "the Parquet view's cold epochs with the machine's free page reporting as it "
                     "is and held back (docs/benchmark.md)"),
    "compressed": ("compressed", "gzip and zstd JSON lines views against line loops over the compressed files (docs/benchmark.md)"),
    "peers": ("peers", "shufflefs against the loaders people use, label-sorted data (docs/benchmark.md, "
              "README.md)"),
    "convergence": ("convergence", "SGD accuracy through each order's mounts (docs/convergence/)"),
    "staging": ("staging", "source bytes per epoch with and without --stage-dir (docs/guide/staging.md)"),
    "s3-costs": ("s3_costs", "GET requests and dollars per epoch at scale, from plans (docs/guide/object-storage.md)"),
    "s3-latency": ("s3_latency", "views of a bucket behind an emulated wide-area link "
                   "(docs/guide/object-storage.md)"),
    "s3-blocks": ("s3_blocks", "block sizes and GETs in flight of a bucket's default view over an emulated link "
                  "(docs/benchmark.md)"),
    "mix-quality": ("mix_quality", "how well each strategy mixes a blend's sources, planned only (docs/guide/mixtures.md)"),
    "mix-speed": ("mix_speed", "a mixture against the pool of the same files, read speed (docs/guide/mixtures.md)"),
    "mix-compare": ("mix_compare", "a mixture against HF interleave_datasets and Streaming (docs/guide/mixtures.md)"),
}


def describe() -> list[str]:
    """One line per section, for ``tools/bench.py --help``."""
    width = max(map(len, STANDALONE))
    return [f"  {name:{width}}  {what}" for name, (_, what) in STANDALONE.items()]


def _only(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The value of the first ``--only`` (bench.py's own) and the arguments without it: a later
    ``--only`` belongs to the section."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--only" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--only="):
            return arg[len("--only="):], argv[:i] + argv[i + 1:]
    return None, argv


def dispatch(argv: Sequence[str]) -> int | None:
    """Run the standalone section ``--only`` names with the rest of ``argv``; None if it names
    none of them (the main run's sections)."""
    only, rest = _only(argv)
    names = [s.strip() for s in (only or "").split(",") if s.strip()]
    alone = [n for n in names if n in STANDALONE]
    if not alone:
        return None
    if len(names) > 1:
        raise SystemExit(f"bench: section {alone[0]} runs alone: --only {alone[0]} (got --only {only})")
    name = alone[0]
    module = importlib.import_module(f"bench.{STANDALONE[name][0]}")
    main: Callable[[list[str]], int | None] = module.main
    program = sys.argv[0]
    sys.argv[0] = f"bench.py --only {name}"  # argparse's prog, in the section's usage line
    try:
        return main(rest) or 0
    finally:
        sys.argv[0] = program
