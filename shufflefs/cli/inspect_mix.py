"""``shufflefs inspect`` of a mixture: how well its epoch mixes its sources (the label of a record
is its source, unless a label option names another), for a mounted shard of ``.mix/NAME/`` or,
offline, for the strategies to compare on its source directory (``--mix NAME --config F``).

Orders are given as ids of the pool of the mixture's files (`pools.mix_index.MixIndex.base_ids`),
so that orders of different strategies, whose epochs each draw their own blocks, share one set of
labels; an up-sampled source's records appear as often as the epoch repeats them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..config import MixSpec
from ..strategies.base import ShuffleSpec
from .common import CliError

PlanArgs = dict[str, int]
"""Keyword arguments of `make_plan` besides the index, spec and epoch (rank, world, part, parts),
and for a shard ``shard`` and ``shards``."""


def source_labels(base: Any, firsts: Sequence[int], globs: Sequence[str]) -> Any:
    """Every record's source, as labels named by the sources' globs."""
    from ..quality.labels import Labels

    counts = np.diff(base.member_firsts[np.asarray(firsts, np.int64)])
    return Labels(np.repeat(np.arange(len(counts)), counts).astype(np.int64), list(globs))


def mixture_orders(members: list[Path], firsts: Sequence[int], mix: MixSpec, fmt: Any, cache: Any,
                   columns: dict[str, tuple[ShuffleSpec, PlanArgs]], epoch: int
                   ) -> tuple[Any, dict[str, Any], dict[str, np.ndarray]]:
    """The pool of ``members`` and, per column, the plan of its spec over the mixture's epoch (a
    shard's stretch of it if ``shard`` is given) and the map of that epoch's records to pool ids."""
    from ..formats import load_or_build_index, scan_file
    from ..index.joined_index import PooledIndex
    from ..pools.mix_index import epoch_index
    from ..strategies import make_plan
    from ..strategies.slices import SlicePlan, slice_edges

    indexes = [load_or_build_index(p, fmt, cache) if cache is not None else scan_file(p, fmt) for p in members]
    base = PooledIndex(indexes)
    weights = [s.weight for s in mix.sources]
    plans, maps = {}, {}
    for column, (spec, kw) in columns.items():
        kw = dict(kw)
        shard, shards = kw.pop("shard", None), kw.pop("shards", None)
        try:
            index = epoch_index(base, firsts, weights, mix.samples, spec, epoch)
        except ValueError as e:
            raise CliError(f"mixture {mix.name!r}: {e}") from None
        plan = make_plan(index, spec, epoch, **kw)
        if shard is not None:
            edges = slice_edges(int(np.asarray(plan.window_records).sum()), shards)
            plan = SlicePlan(plan, int(edges[shard]), int(edges[shard + 1]), shard, shards)
        plans[column], maps[column] = plan, index.base_ids()
    return base, plans, maps


def offline_members(args: argparse.Namespace, parser: argparse.ArgumentParser, rules: list, defaults: dict
                    ) -> tuple[list[Path], tuple[int, ...], MixSpec, Any]:
    """The files of mixture ``--mix`` of ``--config`` under the directory PATH, and their format."""
    from ..errors import ShuffleError
    from ..formats import resolve_format
    from ..pools.lookup import walk
    from ..pools.mixes import mixture_files
    from ..sources import open_store
    from .options import read_config

    if not args.config:
        parser.error("--mix reads the mixture from a config file: give --config")
    try:
        mixes = {m.name: m for m in read_config(args.config).mixes}
    except ValueError as e:
        parser.error(str(e))
    if args.mix not in mixes:
        parser.error(f"--mix {args.mix!r}: the config file has no such mixture (it has: {', '.join(mixes) or 'none'})")
    root = Path(os.path.abspath(args.path))
    if not root.is_dir():
        parser.error(f"{args.path!r} is not a directory (with --mix, PATH is the source directory)")
    formats: dict[str, Any] = {}

    def format_key(rel: str) -> str | None:
        if rel not in formats:
            formats[rel] = resolve_format(rel, rules, defaults)
        return repr(formats[rel]) if formats[rel] is not None else None

    store = open_store(str(root))
    try:
        found = mixture_files(mixes[args.mix], walk(store), format_key)
    except ShuffleError as e:
        raise CliError(e.message, 2) from None
    finally:
        store.close()
    return [root / m for m in found.members], found.firsts, found.spec, formats[found.members[0]]
