"""``shufflefs inspect``: how well a view (or a source under a strategy) is shuffled."""

from __future__ import annotations

import argparse
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import (
    STATS_XATTR,
    XATTR_PREFIX,
    format_buffer,
    parse_buffer,
)
from ..strategies.base import FEW_BLOCKS, ShuffleSpec, resolve_spec
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    _inside,
    _message,
    _mount_root,
    _xattr_failure,
    get_xattr,
)
from .mount import _cache_dir, _check_strategy
from .options import (
    INSPECT_KEYS,
    INSPECT_SHUFFLE_KEYS,
    OPTIONS,
    _buffer,
    _cli_name,
    _integer,
    _strategy,
    resolve_options,
)
from .inspect_parquet import check_parquet, is_parquet, label_hint, parquet_labels
from .stat import _param

INFO_XATTR = XATTR_PREFIX + "info"


@dataclass
class _Inspected:
    """The orders of one file, and what they were computed from."""

    source: Path
    fmt: Any
    index: Any
    spec: ShuffleSpec
    epoch: int
    plans: dict[str, Any]
    """Column name -> `Plan`."""
    data: Any = None
    """The source bytes (uint8 array), once read."""
    auto_block: bool = True
    """Whether the block size is the automatic one (for the advice on files of few blocks)."""
    members: list[Path] | None = None
    """A pooled shard: the pool's source files, whose data regions the pooled index runs through."""
    base_ids: dict[str, Any] | None = None
    """A mixture (or a pool whose torn records are planned last): per column, the pool id of
    every record of its plan's index (`inspect_mix`, `PooledIndex.torn_last`)."""
    source_labels: Any = None
    """A mixture: every pool record's source, the labels measured unless a label option is given."""


def _parse_strategy_list(text: str | None, parser: argparse.ArgumentParser) -> list[tuple[str, str, int | float | None]]:
    """``none,corgipile@2%`` -> [(column name, strategy, buffer or None)]."""
    from ..strategies import STRATEGIES

    if text is None:
        return [(name, name, None) for name in STRATEGIES]
    out: list[tuple[str, str, int | float | None]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, at, buf = item.partition("@")
        try:
            strategy = _strategy(name.strip())
            buffer = _buffer(buf.strip()) if at else None
        except ValueError as e:
            parser.error(f"argument --strategies: {item!r}: {e}")
        if item not in [c for c, _, _ in out]:
            out.append((item, strategy, buffer))
    if not out:
        parser.error("argument --strategies: no strategy given")
    return out


def _order_of(plan: Any) -> Any:
    import numpy as np

    if plan.n_windows == 0:
        return np.zeros(0, np.int64)
    return np.concatenate([plan.window(k) for k in range(plan.n_windows)]).astype(np.int64, copy=False)


def _plan_note(plan: Any) -> str:
    """The parameters that shape this plan's order (the buffer only where it shuffles)."""
    d = plan.describe()
    buffer = format_buffer(plan.spec.buffer)
    if "blocks_per_window" in d:
        return f"buffer {buffer} = {d['blocks_per_window']} blocks/window"
    if "buffer_records" in d:
        return f"buffer {buffer} = {d['buffer_records']} records"
    if "pages" in d:
        return f"{d['pages']} pages of {_param('block_size', plan.spec.page_size)}"
    return ""


def _check_stamp(path: Path, index: Any) -> None:
    from ..index.table import SourceStamp

    if index.stamp is not None and SourceStamp.of(os.stat(path)) != index.stamp:
        raise CliError(f"{path}: the file changed while it was being inspected; run again")


def _inspect_mounted(args: argparse.Namespace, parser: argparse.ArgumentParser, info: dict) -> _Inspected:
    """Rebuild the plan of a mounted view from its attributes and the source file."""
    from ..strategies.costs import record_costs
    from ..formats import load_or_build_index, make_format
    import numpy as np

    from ..index.table import IndexCache
    from ..index.joined_index import PooledIndex
    from ..strategies import make_plan
    from ..strategies.slices import SlicePlan, slice_edges

    given = [k for k in (*INSPECT_SHUFFLE_KEYS, "format", "record_size", "header_bytes", "cache_dir", "config", "strategies")
             if getattr(args, k, None)]
    if given:
        parser.error(f"{_cli_name(given[0])} does not apply to a mounted view: the mount chose its order "
                     "(inspect the source file to compare other settings)")
    root = _mount_root(args.path)
    if root is None:
        raise CliError(f"{args.path}: cannot find the root of its shufflefs mount")
    if "pool" in info and "mixture" not in info and (info.get("pool_declared") or args.verify):
        raise CliError(f"{args.path}: shard {info.get('shard')} of the pool {info['pool']!r} declared by --pool"
                       if not args.verify else f"{args.path}: --verify does not apply to a pooled shard"
                       "; inspect a member in the source, or a view of a mount made with --no-pool")
    try:
        stats = json.loads(get_xattr(root, STATS_XATTR))
        fmt = make_format(info["format"], info.get("format_params") or {})
        spec = ShuffleSpec(strategy=info["strategy"], seed=int(info["seed"]), block_size=int(info["block_size"]),
                           buffer=parse_buffer(info["buffer"]), page_size=int(stats.get("page_size", 4096)),
                           even=str(stats.get("even", "none")), exchange=float(info.get("exchange", 0.0)),
                           pls_local=str(info.get("local", "uniform")),
                           balance=bool(stats.get("balance", False)), balance_field=stats.get("balance_field"),
                           random_level=float(stats.get("random_level", 0.0)))
        source = Path(stats["source"]) / info["path"]
        view_epoch = int(info["epoch"])
        rank, world = int(stats.get("rank", 0)), int(stats.get("world", 1))
        part, parts = int(info.get("part", 0)), int(info.get("parts", 1))
    except (KeyError, TypeError, ValueError) as e:
        raise CliError(f"{args.path}: unexpected shufflefs attributes ({_message(e)})") from None
    epoch = view_epoch
    if args.epoch is not None:
        try:
            epoch = OPTIONS["epoch"].convert(args.epoch)
        except ValueError as e:
            parser.error(f"argument --epoch: {e}")
        if args.verify and epoch != view_epoch:
            parser.error(f"--verify reads the view, which is in epoch {view_epoch}, not {epoch}")
    cache = IndexCache(Path(stats["cache_dir"]))
    name = (f"{spec.strategy}" + (f" rank {rank}/{world}" if world > 1 else "")
            + (f" part {part}/{parts}" if parts > 1 else ""))
    auto = bool(info.get("block_size_auto", True))
    if "mixture" in info:
        return _mounted_mixture(args, info, stats, spec, fmt, cache, epoch, name, auto,
                                dict(rank=rank, world=world, part=part, parts=parts))
    if "pool" in info:
        members = _pool_members(source, info, fmt, cache)
        pool = PooledIndex([m for _, m in members])
        index = pool.torn_last()  # planned as the mount plans it: its members' torn records last
        if spec.balance:
            raise CliError(f"{args.path}: a pooled shard of a --balance mount cannot be inspected")
        stream = make_plan(index, spec, epoch, rank, world, part, parts)
        edges = slice_edges(int(np.asarray(stream.window_records).sum()), len(members))
        shard = int(info["shard"])
        plan = SlicePlan(stream, int(edges[shard]), int(edges[shard + 1]), shard, len(members))
        column = f"{name} shard {shard}/{len(members)}"
        maps = None if index is pool else {column: index.base_ids()}
        return _Inspected(source, fmt, pool, spec, epoch, {column: plan}, auto_block=auto,
                          members=[p for p, _ in members], base_ids=maps)
    index = load_or_build_index(source, fmt, cache)
    costs = record_costs(str(source), index, spec.balance_field, fmt.name) if spec.balance else None
    plan = make_plan(index, spec, epoch, rank, world, part, parts, costs=costs)
    return _Inspected(source, fmt, index, spec, epoch, {name: plan}, auto_block=auto)


def _mounted_mixture(args: argparse.Namespace, info: dict, stats: dict, spec: ShuffleSpec, fmt: Any, cache: Any,
                     epoch: int, name: str, auto: bool, kw: dict) -> _Inspected:
    """A shard of a mixture: its order and the whole blend's (all shards in name order)."""
    from ..config import MixSource, MixSpec
    from .inspect_mix import mixture_orders, source_labels

    if args.verify:
        raise CliError(f"{args.path}: --verify does not apply to a mixture's shard")
    if spec.balance:
        raise CliError(f"{args.path}: a mixture of a --balance mount cannot be inspected")
    if "mixture_members" not in info:
        raise CliError(f"{args.path}: the mixture has too many files ({info.get('mixture_files')}) for its "
                       "attributes to list them; inspect it offline: shufflefs inspect SRC --mix NAME --config F")
    if "://" in str(stats["source"]):
        raise CliError(f"{args.path}: the mixture's files are in {stats['source']}; inspect reads local files: "
                       "inspect a local copy with --mix NAME --config F")
    root = Path(stats["source"])
    members = [root / m for m in info["mixture_members"]]
    sources = [MixSource(g, float(w)) for g, w in info["mixture_sources"]]
    mix = MixSpec(info["mixture"], tuple(sources), info.get("mixture_samples"))
    shard, shards = int(info["shard"]), int(info["pool_shards"])
    columns = {f"{name} blend": (spec, kw),  # first: the uniform reference permutes the whole blend
               f"{name} shard {shard}/{shards}": (spec, {**kw, "shard": shard, "shards": shards})}
    firsts = info["mixture_firsts"]
    base, plans, maps = mixture_orders(members, firsts, mix, fmt, cache, columns, epoch)
    return _Inspected(root / info["path"], fmt, base, resolve_spec(spec, base), epoch, plans, auto_block=auto,
                      members=members, base_ids=maps, source_labels=source_labels(base, firsts, [s.glob for s in sources]))


def _offline_mixture(args: argparse.Namespace, parser: argparse.ArgumentParser) -> _Inspected:
    """The strategies of --strategies over mixture --mix of --config, on the source directory PATH."""
    from .inspect_mix import mixture_orders, offline_members, source_labels

    if args.verify:
        parser.error("--verify reads a mounted view; PATH is not in a shufflefs mount")
    entries = _parse_strategy_list(args.strategies, parser)
    opts = resolve_options(args, INSPECT_KEYS, parser)
    v = opts.values
    members, firsts, mix, fmt = offline_members(args, parser, opts.rules, opts.format_defaults)
    cache = _inspect_cache(v["cache_dir"], Path(os.path.realpath(args.path)), parser)
    columns = {}
    for column, strategy, buffer in entries:
        spec = ShuffleSpec(strategy=strategy, seed=v["seed"], block_size=v["block_size"],
                           buffer=v["buffer"] if buffer is None else buffer, page_size=v["page_size"])
        _check_strategy(spec, parser)
        columns[column] = (spec, {})
    base, plans, maps = mixture_orders(members, firsts, mix, fmt, cache, columns, v["epoch"])
    spec = resolve_spec(ShuffleSpec(seed=v["seed"], block_size=v["block_size"], buffer=v["buffer"]), base)
    return _Inspected(Path(os.path.abspath(args.path)), fmt, base, spec, v["epoch"], plans,
                      auto_block=v["block_size"] is None, members=members, base_ids=maps,
                      source_labels=source_labels(base, firsts, [s.glob for s in mix.sources]))


def _pool_members(source: Path, info: dict, fmt: Any, cache: Any) -> list[tuple[Path, Any]]:
    """The source files of a shard's name-recognised pool, in shard order, with their indexes: the
    files of its directory whose names share its pattern (`pools.shard_key`), as the mount found
    them; a different count than the mount's means the directory changed (run again)."""
    from ..formats import load_or_build_index
    from ..pools.shards import path_order, shard_key

    key = shard_key(source.name)
    found = []
    for entry in os.scandir(source.parent) if key is not None else ():
        k = shard_key(entry.name)
        if k is not None and k[0] == key[0] and entry.is_file(follow_symlinks=False):
            found.append((k[1], entry.name))
    found.sort(key=lambda f: (f[0], path_order(f[1])))
    paths = [source.parent / name for _, name in found]
    if len(paths) != int(info.get("pool_shards", -1)) or source not in paths:
        raise CliError(f"{source}: its pool {info['pool']!r} has {info.get('pool_shards')} shards in the mount, "
                       f"{len(paths)} files here; the source changed (run again)")
    return [(p, load_or_build_index(p, fmt, cache)) for p in paths]


def _inspect_cache(given: Path | None, parent: Path, parser: argparse.ArgumentParser) -> Any:
    """The index cache for a source file, or None to scan without one (the default cache directory
    lies inside the file's directory, or cannot be written)."""
    from ..index.table import IndexCache, default_cache_dir

    if given is not None:
        return IndexCache(_cache_dir(given, parent, parser))
    cache_dir = default_cache_dir()
    real = os.path.realpath(cache_dir)
    if real == str(parent) or _inside(real, str(parent)):
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return IndexCache(cache_dir) if os.access(cache_dir, os.W_OK | os.X_OK) else None


def _inspect_source(args: argparse.Namespace, parser: argparse.ArgumentParser) -> _Inspected:
    """Plans of every requested strategy for a source file, as a mount with these options would make."""
    from ..errors import ShuffleError
    from ..formats import load_or_build_index, resolve_format, scan_file
    from ..strategies import make_plan

    if getattr(args, "mix", None):
        return _offline_mixture(args, parser)
    if args.verify:
        parser.error("--verify reads a mounted view; PATH is not in a shufflefs mount")
    entries = _parse_strategy_list(args.strategies, parser)
    opts = resolve_options(args, INSPECT_KEYS, parser)
    v = opts.values
    path = Path(os.path.abspath(args.path))
    if not path.is_file():
        parser.error(f"{args.path!r} is not a file")
    try:
        fmt = resolve_format(args.path, opts.rules, opts.format_defaults)
    except (ShuffleError, ValueError) as e:
        parser.error(str(e))
    if fmt is None:
        parser.error(f"{args.path!r} has no record format (choose one with --format, e.g. "
                     f"'--format {path.name}=lines', or --record-size for '.bin')")
    cache = _inspect_cache(v["cache_dir"], Path(os.path.realpath(path.parent)), parser)
    index = load_or_build_index(path, fmt, cache) if cache is not None else scan_file(path, fmt)
    base = resolve_spec(ShuffleSpec(strategy="none", seed=v["seed"], block_size=v["block_size"], buffer=v["buffer"],
                                    page_size=v["page_size"]), index)  # an automatic block size fixed for this file
    plans = {}
    for column, strategy, buffer in entries:
        spec = ShuffleSpec(strategy=strategy, seed=base.seed, block_size=base.block_size,
                           buffer=base.buffer if buffer is None else buffer, page_size=base.page_size)
        _check_strategy(spec, parser)
        plans[column] = make_plan(index, spec, v["epoch"])
    return _Inspected(path, fmt, index, base, v["epoch"], plans, auto_block=v["block_size"] is None)


def _pooled_data(got: _Inspected) -> Any:
    """The data regions of a pool's members, concatenated: the bytes its pooled offsets address."""
    import numpy as np

    from ..quality.labels import read_source

    parts = []
    for path, (size, head, tail) in zip(got.members or [], got.index.member_frames):
        data = read_source(path, got.fmt)
        if len(data) != size:
            raise CliError(f"{path}: the file changed while it was being inspected; run again")
        parts.append(data[head:tail])
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _label_source(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    from ..quality.labels import BYTE, COLUMN, FIELD, LabelSource

    if args.label_field is not None:
        return LabelSource(FIELD, args.label_field)
    if args.label_column is not None:
        return LabelSource(COLUMN, args.label_column)
    if args.label_byte is not None:
        try:
            return LabelSource(BYTE, _integer(0)(args.label_byte))
        except ValueError as e:
            parser.error(f"argument --label-byte: {e}")
    return None


def _verify_view(path: str, got: _Inspected) -> None:
    """Read the view and compare it with the bytes of the order computed for it."""
    import numpy as np

    from ..windows.layout import render

    fd = os.open(path, os.O_RDONLY)
    try:
        # the attributes of the open handle: the epoch this handle reads, whatever happens meanwhile
        info = json.loads(os.getxattr(fd, INFO_XATTR))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    view = b"".join(chunks)
    if got.fmt.codec is not None:  # a compressed view: its decoded bytes are the order's
        from ..formats.codecs import decode_bytes

        view = decode_bytes(got.fmt.codec, view)
    if int(info["epoch"]) != got.epoch:
        raise CliError(f"{path}: the epoch changed to {info['epoch']} while inspecting epoch {got.epoch}; run again")
    (plan,) = got.plans.values()
    index, data = got.index, got.data
    if plan.index is not index:  # a pool's torn records last: its segments' bytes in their order
        from ..strategies.units import concat_ranges

        b, first = index.bounds, plan.index.seg_base
        index, data = plan.index, data[concat_ranges(b[first], b[first + np.diff(plan.index.member_firsts)])]
    expected = render(index, plan, data)
    if view != expected:
        n = min(len(view), len(expected))
        diff = np.flatnonzero(np.frombuffer(view[:n], np.uint8) != np.frombuffer(expected[:n], np.uint8))
        where = f"first at byte {int(diff[0])}" if len(diff) else f"sizes {len(view)} and {len(expected)}"
        raise CliError(f"{path}: VERIFY FAILED: the view is not the order reported ({where})")


def cmd_inspect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..errors import ShuffleError
    from ..quality.labels import extract_labels, read_source
    from ..quality.metrics import block_of_records, format_report, report

    try:
        k, batch = _integer(1)(args.window), _integer(1)(args.batch)
    except ValueError as e:
        parser.error(f"argument --window/--batch: {e}")
    label_source = _label_source(args, parser)
    if args.png:
        from ..quality.plots import have_matplotlib

        if not have_matplotlib():
            parser.error("--png needs matplotlib (pip install 'shufflefs[plot]')")
    try:
        raw = os.getxattr(args.path, INFO_XATTR)
    except OSError as e:
        if e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise _xattr_failure(e, args.path, INFO_XATTR) from None
        raw = None
    try:
        if raw is not None:
            try:
                info = json.loads(raw)
            except ValueError:
                raise CliError(f"{args.path}: unreadable {INFO_XATTR}: {raw[:200]!r}") from None
            got = _inspect_mounted(args, parser, info)
            mounted = True
        else:
            got = _inspect_source(args, parser)
            mounted = False
        labels = None
        parquet = is_parquet(got.fmt)
        if parquet:
            check_parquet(got.fmt, label_source, args.verify, args.path)
            labels = parquet_labels(got, label_source) if label_source is not None else got.source_labels
        elif (label_source is not None or args.verify) and got.members is not None:
            got.data = _pooled_data(got)
        elif label_source is not None or args.verify:
            got.data = read_source(got.source, got.fmt)
            _check_stamp(got.source, got.index)
        if label_source is not None and not parquet:
            labels = extract_labels(got.index, getattr(got.fmt, "plain_name", got.fmt.name), got.data, label_source,
                                    str(got.source))
        elif got.source_labels is not None and not parquet:
            labels = got.source_labels
        if args.verify:
            _verify_view(args.path, got)
    except ShuffleError as e:
        raise CliError(str(e)) from None
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    except OSError as e:
        raise CliError(f"{e.filename or args.path}: {e.strerror or e}") from None

    orders = {name: _order_of(plan) for name, plan in got.plans.items()}
    if got.base_ids is not None:  # a mixture, or a pool with torn records: its records as ids of its files' pool
        orders = {name: got.base_ids[name][order] for name, order in orders.items()}
    notes = {name: _plan_note(plan) for name, plan in got.plans.items()}
    blocks = block_of_records(got.index.bounds, got.spec.block_size)
    rep = report(orders, labels.codes if labels else None, blocks, k, batch,
                 labels.names if labels else None)
    rep.notes = notes
    where = (f"{args.path} (view of {got.source}, epoch {got.epoch}, seed {got.spec.seed})" if mounted
             else f"{got.source} (epoch {got.epoch}, seed {got.spec.seed})")
    if args.png:
        from ..quality.plots import plot_orders

        title = f"{os.path.basename(args.path)}: {rep.records} records, epoch {got.epoch}, seed {got.spec.seed}, " \
                f"block {_param('block_size', got.spec.block_size)}"
        try:
            plot_orders(orders, args.png, labels.codes if labels else None, labels.names if labels else None,
                        title=title, subtitles=notes)
        except OSError as e:
            raise CliError(f"{args.png}: {e.strerror or e}") from None
    few = 0 < (rep.blocks or 0) < FEW_BLOCKS
    auto = got.auto_block
    if args.json:
        out = {"few_blocks": few, "path": os.path.abspath(args.path), "source": str(got.source), "mounted": mounted,
               "format": got.fmt.name, "epoch": got.epoch, "seed": got.spec.seed,
               "block_size": got.spec.block_size, "page_size": got.spec.page_size,
               "label": label_source.describe() if label_source else ("source" if labels is not None else None),
               "verified": bool(args.verify), **rep.to_json()}
        print(json.dumps(out, indent=2))
        return EXIT_OK
    label_text = ""
    if labels is not None:
        import numpy as np

        mixture = got.source_labels is not None
        held = labels.codes[next(iter(orders.values()))] if mixture else labels.codes  # a mixture's epoch
        counts = np.bincount(held, minlength=labels.n_labels)
        shown = ", ".join(f"{n}={c}" for n, c in zip(labels.names[:10], counts[:10].tolist()))
        by = label_source.describe() if label_source is not None else "source"
        label_text = f", {labels.n_labels} labels by {by} ({shown}{', ...' if labels.n_labels > 10 else ''})"
    print(f"{where}")
    print(f"{rep.records} records in {rep.blocks or 0} blocks of {_param('block_size', got.spec.block_size)}{label_text}")
    if labels is None and parquet:
        print(f"  {label_hint(got)}")
    if few:
        print(f"  few blocks: fewer than {FEW_BLOCKS}, so block barely shuffles this file and corgipile only within "
              "its buffer; " + ("use --strategy full or once for files this small" if auto else "lower --block-size"))
    for name, note in notes.items():
        if note:
            print(f"  {name}: {note}")
    print()
    print(format_report(rep))
    if args.verify:
        print("\nverified: the view holds exactly these records in this order")
    if args.png:
        print(f"\npicture: {args.png}")
    return EXIT_OK
