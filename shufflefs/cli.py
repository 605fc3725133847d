"""The ``shufflefs`` command: mount, epoch, umount, index, stat, inspect, advise and demo.

Everything a mount needs is validated here, before any process is started, so that mistakes
surface as a usage error (exit 2) in the user's terminal rather than in a daemon's log.  A
background mount re-runs this same command with ``-f`` in a new session and waits on a pipe
until the daemon reports the mount ready, so that the mount is usable the moment we return.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__, control
from .config import (
    EPOCH_XATTR,
    MAX_BLOCK,
    MAX_EPOCH,
    MAX_PAGE,
    MAX_SEED,
    MAX_SIZE,
    MAX_WORLD,
    MIN_BLOCK,
    MIN_BUFFER,
    MIN_BUFFER_FRACTION,
    MIN_PAGE,
    PID_XATTR,
    STATS_XATTR,
    XATTR_PREFIX,
    MountConfig,
    check_paths,
    format_buffer,
    format_size,
    parse_buffer,
    parse_size,
)
from .index import default_cache_dir
from .strategies.base import EVEN_MODES, LOCAL_MODES, ShuffleSpec, resolve_spec

PROG = "shufflefs"

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------- option values


def _integer(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or isinstance(value, float):
            raise ValueError(f"not an integer: {value!r}")
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"not an integer: {value!r}") from None
        if n < lo or (hi is not None and n > hi):
            bound = f">= {lo}" if hi is None else f">= {lo} and <= {hi}"
            raise ValueError(f"must be an integer {bound}: {value!r}")
        return n

    return convert


def _size_or_zero(value: Any) -> int:
    if (isinstance(value, str) and value.strip() == "0") or (type(value) is int and value == 0):
        return 0
    return _size(value)


def _size(value: Any) -> int:
    if isinstance(value, bool) or isinstance(value, float):
        raise ValueError(f"not a size: {value!r} (examples: 4096, 64KiB, 4MiB, 1GB)")
    return parse_size(value)


def _size_in(lo: int, hi: int, power_of_two: bool = False) -> Callable[[Any], int]:
    """A size option with a sane range: anything outside would mount and then fail every open."""
    def convert(value: Any) -> int:
        n = _size(value)
        if not lo <= n <= hi:
            raise ValueError(f"must be between {format_size(lo)} and {format_size(hi)}: {value!r}")
        if power_of_two and n & (n - 1):
            raise ValueError(f"must be a power of two (512, 4096, 64KiB, ...): {value!r}")
        return n

    return convert


def _auto_or(convert: Callable[[Any], int]) -> Callable[[Any], int | None]:
    """``auto`` (None: chosen per file) or a value ``convert`` accepts."""
    def either(value: Any) -> int | None:
        if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
            return None
        return convert(value)

    return either


def _buffer(value: Any) -> int | float:
    if isinstance(value, bool):
        raise ValueError(f"not a buffer size: {value!r}")
    b = parse_buffer(value)
    if isinstance(b, float) and b < MIN_BUFFER_FRACTION:
        raise ValueError(f"a buffer share must be at least {MIN_BUFFER_FRACTION * 100:g}%: {value!r}")
    if isinstance(b, int) and not MIN_BUFFER <= b <= MAX_SIZE:
        raise ValueError(f"a buffer must be between {format_size(MIN_BUFFER)} and {format_size(MAX_SIZE)}: {value!r}")
    return b


def _path(value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"not a path: {value!r}")
    return Path(os.path.abspath(os.path.expanduser(str(value))))


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false: {value!r}")
    return value


def _field(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"not a field name: {value!r}")
    return value


def _strategy(value: Any) -> str:
    from .strategies import STRATEGIES

    if not isinstance(value, str) or value not in STRATEGIES:
        raise ValueError(f"unknown strategy {value!r} (choose from {', '.join(STRATEGIES)})")
    return value


@dataclass(frozen=True)
class _Option:
    convert: Callable[[Any], Any]
    default: Any
    env: str | None = None
    """An environment variable that gives the value when neither the command line nor the config
    file does (torchrun sets RANK and WORLD_SIZE for every process it starts)."""


def _fraction(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"not a fraction: {value!r}")
    try:
        q = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"not a fraction: {value!r}") from None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"must be a fraction in [0, 1]: {value!r}")
    return q


def _one_of(modes: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in modes:
            raise ValueError(f"must be one of {', '.join(modes)}: {value!r}")
        return str(value)

    return convert


MiB = 1 << 20
VERIFY_MODES = ("frames", "index")

OPTIONS: dict[str, _Option] = {
    "strategy": _Option(_strategy, "corgipile"),
    "block_size": _Option(_auto_or(_size_in(MIN_BLOCK, MAX_BLOCK)), None),
    "buffer": _Option(_buffer, 64 * MiB),
    "seed": _Option(_integer(0, MAX_SEED), 0),
    "epoch": _Option(_integer(0, MAX_EPOCH), 0),
    "page_size": _Option(_size_in(MIN_PAGE, MAX_PAGE, power_of_two=True), 4096),
    "rank": _Option(_integer(0, MAX_WORLD - 1), 0, "RANK"),
    "world_size": _Option(_integer(1, MAX_WORLD), 1, "WORLD_SIZE"),
    "even": _Option(_one_of(EVEN_MODES), "none"),
    "exchange": _Option(_fraction, 0.0),
    "pls_local": _Option(_one_of(LOCAL_MODES), "uniform"),
    "stage_dir": _Option(_path, None),
    "verify": _Option(_one_of(VERIFY_MODES), "frames"),
    "balance": _Option(_flag, False),
    "balance_field": _Option(_field, None),
    "random_level": _Option(_fraction, 0.0),
    "cache_dir": _Option(_path, None),
    "no_pool": _Option(_flag, False),
    "record_size": _Option(_size_in(1, MAX_BLOCK), None),
    "header_bytes": _Option(_size_or_zero, None),
    "log_file": _Option(_path, None),
    "verbose": _Option(_integer(0), 0),
    "foreground": _Option(_flag, False),
}
"""Options that a ``--config`` file may also set (as top-level keys, dashes or underscores)."""

FORMAT_KEYS = ("cache_dir", "record_size", "header_bytes")
PATH_KEYS = ("cache_dir", "log_file", "stage_dir")
"""Relative paths in a config file are relative to the file's directory."""
MOUNT_KEYS = tuple(OPTIONS)


def _cli_name(key: str) -> str:
    return "--" + key.replace("_", "-")


# --------------------------------------------------------------------------- config file


@dataclass
class ConfigFile:
    values: dict[str, Any]
    formats: list[str]
    """``[[format]]`` tables rewritten as ``--format`` texts, in file order."""
    pools: list[str] = field(default_factory=list)
    """``[[pool]]`` tables' globs, in file order."""


def read_config(path: str | os.PathLike) -> ConfigFile:
    """Parse a TOML config file; raises ValueError with a message naming the file and key."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ValueError("reading --config needs Python 3.11 or the 'tomli' package") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"cannot read config file {str(path)!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {str(path)!r}: {e}") from None

    values: dict[str, Any] = {}
    formats: list[str] = []
    pools: list[str] = []
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        where = f"config file {str(path)!r}"
        if key == "format":
            tables = value if isinstance(value, list) else [value]
            for i, table in enumerate(tables):
                formats.append(_format_table_text(table, f"{where}: [[format]] #{i + 1}"))
        elif key == "pool":
            tables = value if isinstance(value, list) else [value]
            for i, table in enumerate(tables):
                pools.append(_pool_table_glob(table, f"{where}: [[pool]] #{i + 1}"))
        elif key in OPTIONS:
            values[key] = value
        else:
            known = ", ".join(sorted([*OPTIONS, "format", "pool"]))
            raise ValueError(f"{where}: unknown key {raw_key!r} (known: {known})")
    return ConfigFile(values, formats, pools)


def _pool_table_glob(table: Any, where: str) -> str:
    if not isinstance(table, dict) or set(table) != {"glob"} or not isinstance(table["glob"], str) or not table["glob"]:
        raise ValueError(f"{where}: must be a table with one key, glob (a non-empty string)")
    return table["glob"]


def _format_table_text(table: Any, where: str) -> str:
    """``{glob, format, params}`` -> ``GLOB=NAME:k=v,...``, the text ``--format`` takes."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table with keys glob, format and params")
    unknown = set(table) - {"glob", "format", "params"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: glob, format, params)")
    glob, name, params = table.get("glob"), table.get("format"), table.get("params", {})
    if not isinstance(glob, str) or not glob:
        raise ValueError(f"{where}: 'glob' must be a non-empty string")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: 'format' must be a non-empty string")
    if not isinstance(params, dict):
        raise ValueError(f"{where}: 'params' must be a table")
    parts = []
    for k, v in params.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        if isinstance(v, (dict, list)) or "," in str(v) or "=" in str(k):
            raise ValueError(f"{where}: parameter {k!r} must be a plain value without commas")
        parts.append(f"{k}={v}")
    return f"{glob}={name}" + (":" + ",".join(parts) if parts else "")


# --------------------------------------------------------------------------- argument parser


def _strategy_lines() -> str:
    from .strategies import STRATEGIES, STRATEGY_HELP

    width = max(len(s) for s in STRATEGIES)
    return "\n".join(f"  {name:<{width}}  {STRATEGY_HELP.get(name, '')}" for name in STRATEGIES)


def _add_format_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("formats and index cache")
    g.add_argument(
        "--format", action="append", default=[], metavar="GLOB=NAME[:k=v,...]",
        help="record format of files matching GLOB (relative to SRC), with its parameters; "
        "repeatable, first match wins; files no rule matches are typed by extension",
    )
    g.add_argument("--record-size", metavar="SIZE", help="record size of fixed-size '.bin' files")
    g.add_argument("--header-bytes", metavar="SIZE", help="header bytes of fixed-size '.bin' files (default 0)")
    g.add_argument("--cache-dir", metavar="DIR", help="where indexes are cached (default: %s)" % _default_cache_text())
    g.add_argument(
        "--config", metavar="FILE",
        help="TOML file: top-level keys are long option names, [[format]] tables hold glob, "
        "format and params; options given here override it",
    )


def _default_cache_text() -> str:
    return str(default_cache_dir())


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from .strategies import STRATEGIES

    strategies = _strategy_lines()
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Mount a dataset directory read-only; every data file shows its records in a "
        "fresh shuffled order each epoch.",
        epilog=f"strategies:\n{strategies}\n\nRun '{PROG} COMMAND --help' for the options of a command.",
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subs: dict[str, argparse.ArgumentParser] = {}

    p = subs["mount"] = sub.add_parser(
        "mount", help="mount SRC at MNT with shuffled views", formatter_class=raw,
        description="Mount SRC at MNT. Returns once the mount is ready; the daemon keeps running "
        "in the background until 'shufflefs umount MNT'.",
        epilog=f"strategies:\n{strategies}\n\n"
        "sizes: 4096, 64KiB, 4MiB, 1GB; --buffer also takes a share of each file's record "
        "bytes (10%).\nOne --buffer sizes the buffer of every strategy that has one, so "
        "strategies compare at equal memory.",
    )
    p.add_argument("source", metavar="SRC", help="dataset directory")
    p.add_argument("mountpoint", metavar="MNT", help="empty directory to mount on")
    g = p.add_argument_group("shuffling")
    g.add_argument("--strategy", choices=list(STRATEGIES), metavar="S", help="shuffle strategy (default corgipile; listed below)")
    g.add_argument("--block-size", metavar="SIZE|auto",
                   help="bytes per block, the unit of storage reads and of block shuffling, 512 B to 1GiB; "
                        "auto (default): per file, the largest power of two up to 1/64 of its record bytes, "
                        "between --page-size and 4MiB, so that every file has dozens of blocks to permute")
    g.add_argument("--buffer", metavar="SIZE|P%", help="shuffle buffer: bytes (4KiB to 1TiB), or a percentage of each "
                   "file's record bytes (0.01%% to 100%%) (default 64MiB)")
    g.add_argument("--seed", metavar="N", help="seed of every order, 0 to 2**63-1 (default 0)")
    g.add_argument("--epoch", metavar="N", help=f"initial epoch, 0 to {MAX_EPOCH} (default 0)")
    g.add_argument("--page-size", metavar="SIZE", help="page size for page-aware strategies, a power of two from 512 to 1MiB (default 4096)")
    g.add_argument("--exchange", metavar="Q", help="pls: fraction of every rank's records traded with other "
                   "ranks before each epoch, 0 (pure local shuffling) to 1 (default 0)")
    g.add_argument("--pls-local", choices=LOCAL_MODES, default=None,
                   help="pls: how each rank shuffles its partition: uniform (default) or corgipile "
                        "(its records grouped by block, blocks permuted, records shuffled inside "
                        "the buffer: block-sized reads)")
    g.add_argument("--verify", choices=VERIFY_MODES, default=None,
                   help="frames (default): check every TFRecord frame's checksums in every window as it "
                        "is gathered, so a byte changed after indexing is EIO, never served; index: "
                        "only when the index is built")
    g.add_argument("--stage-dir", metavar="DIR",
                   help="pls: keep this rank's partition of every file on local disk under DIR: "
                        "copied from SRC when a file's first view opens, then each next epoch's "
                        "built in the background from the kept records plus only the received "
                        "ones read from SRC (about Q of the share); removed at unmount")
    g = p.add_argument_group(
        "ranks and loader parts",
        "The mount shows rank R's share of every epoch; the W ranks' shares are disjoint and hold "
        "every record once. MNT/.parts/K/i/ mirrors the tree with the i-th of K disjoint parts of "
        "each view, one per DataLoader worker.")
    g.add_argument("--rank", metavar="R", help="this mount's rank (default $RANK, else 0)")
    g.add_argument("--world-size", "--world", dest="world_size", metavar="W",
                   help="number of ranks (default $WORLD_SIZE, else 1)")
    g.add_argument("--even", choices=EVEN_MODES, default=None,
                   help="equal record counts per rank: none (default: every record exactly once, "
                        "counts may differ by a block's records), pad (short ranks repeat some of "
                        "their records, like DistributedSampler) or drop (long ranks leave their "
                        "last records out)")
    g.add_argument("--balance", action="store_true", default=None,
                   help="with --strategy full: assign records so that the i-th record of every rank "
                        "has a similar cost (its byte length), like Bagua's load-balancing sampler; "
                        "still every record once per epoch (with --even none)")
    g.add_argument("--balance-field", metavar="NAME",
                   help="JSON lines: the cost of a record is this numeric top-level field (e.g. a "
                        "token count) instead of its byte length; implies --balance")
    g.add_argument("--random-level", metavar="X",
                   help="--balance: noise added to the costs before sorting, 0 (the same cost "
                        "groups every epoch) to 1 (noise spanning the cost range) (default 0)")
    _add_format_options(p)
    g = p.add_argument_group(
        "pools of shards",
        "Numbered files of one stem and extension in one directory (train-00000-of-00064.tfrecord, "
        "part-00001.jsonl, shard-000123.tar) are shards of one set, shuffled as one pool: output "
        "shard i, under its own name, holds the i-th equal share of the pool's stream, so the "
        "shards read in name order are the pooled order. Other files are shuffled alone.")
    g.add_argument("--pool", action="append", default=[], metavar="GLOB",
                   help="declare a set: the data files matching GLOB (relative to SRC, '*' spans "
                        "directories) are one pool; repeatable, first match wins; also [[pool]] "
                        "tables with a glob key in --config")
    g.add_argument("--no-pool", action="store_true", default=None,
                   help="shuffle every file alone, shards of a set too")
    g = p.add_argument_group("daemon")
    g.add_argument("--log-file", metavar="FILE", help="append the daemon's log here")
    g.add_argument("-v", "--verbose", action="count", default=None, help="more output (repeatable)")
    g.add_argument("-f", "--foreground", action="store_true", default=None, help="run the daemon in this process")
    g.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)

    p = subs["epoch"] = sub.add_parser(
        "epoch", help="show or set the epoch",
        description="Show the epoch of a mount (MNT is its root: every file), of a directory in it "
        "(the files below) or of one file; with N set it, with 'next' advance it by one. Setting "
        "it on the root or a directory replaces the epochs set below it.",
    )
    p.add_argument("path", metavar="MNT", help="mount root, or a directory or file inside the mount")
    p.add_argument("value", metavar="N|next", nargs="?", help="new epoch, or 'next'")

    p = subs["umount"] = sub.add_parser(
        "umount", help="unmount and wait for the daemon to exit",
        description="Unmount MNT (fusermount3 -u, or umount) and wait for its daemon to exit.",
    )
    p.add_argument("mountpoint", metavar="MNT")
    p.add_argument("-l", "--lazy", action="store_true", help="detach now even if busy; the daemon exits when the last file closes")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SEC", help="how long to wait for the daemon to exit (default 10)")

    p = subs["index"] = sub.add_parser(
        "index", help="build (or check) the index of every data file in SRC",
        description="Build the index of every data file in SRC, or reuse the cached one, so a later "
        "mount starts without scanning.",
    )
    p.add_argument("source", metavar="SRC", help="dataset directory")
    _add_format_options(p)

    p = subs["stat"] = sub.add_parser("stat", help="show a mount's settings and counters")
    p.add_argument("mountpoint", metavar="MNT")
    p.add_argument("--json", action="store_true", help="print the raw JSON")

    p = subs["demo"] = sub.add_parser(
        "demo", help="mount a small label-sorted dataset and show two shuffled epochs",
    )
    p.add_argument("--dir", metavar="DIR", help="work here instead of a new temporary directory")
    p.add_argument("--keep", action="store_true", help="keep the generated files")

    _add_inspect_parser(sub, subs, strategies)
    _add_advise_parser(sub, subs)
    return parser, subs


# --------------------------------------------------------------------------- resolving options


@dataclass
class Resolved:
    values: dict[str, Any]
    rules: list[Any]
    """`shufflefs.formats.FormatRule`s: command line first, then the config file's."""
    pools: list[str] = field(default_factory=list)
    """Declared pool globs: command line first, then the config file's."""

    @property
    def format_defaults(self) -> dict[str, Any]:
        return _format_defaults(self.values)


def _format_defaults(values: dict[str, Any]) -> dict[str, Any]:
    return {k: values[k] for k in ("record_size", "header_bytes") if values.get(k) is not None}


def resolve_options(args: argparse.Namespace, keys: Sequence[str], parser: argparse.ArgumentParser) -> Resolved:
    """Merge command line over config file over defaults, converting and checking every value."""
    cfg = ConfigFile({}, [])
    if getattr(args, "config", None):
        try:
            cfg = read_config(args.config)
        except ValueError as e:
            parser.error(str(e))
    values: dict[str, Any] = {}
    for key in keys:
        opt = OPTIONS[key]
        given = getattr(args, key, None)
        if given is not None:
            raw, where = given, f"argument {_cli_name(key)}"
        elif key in cfg.values:
            raw, where = cfg.values[key], f"config file {args.config!r}: {key}"
            if key in PATH_KEYS and isinstance(raw, str):
                raw = os.path.join(os.path.dirname(os.path.abspath(args.config)), os.path.expanduser(raw))
        elif opt.env and os.environ.get(opt.env, "").strip():
            raw, where = os.environ[opt.env].strip(), f"environment variable {opt.env}"
        else:
            values[key] = opt.default
            continue
        try:
            values[key] = opt.convert(raw)
        except ValueError as e:
            parser.error(f"{where}: {e}")

    from .formats import parse_format_option

    rules = []
    for text in [*args.format, *cfg.formats]:
        try:
            rules.append(parse_format_option(text, _format_defaults(values)))
        except (ValueError, KeyError, TypeError) as e:
            parser.error(f"argument --format: {_message(e)}")
    return Resolved(values, rules, [*getattr(args, "pool", []), *cfg.pools])


def _message(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


def _inside(path: str, parent: str) -> bool:
    return path != parent and os.path.commonpath([path, parent]) == parent


def _check_writable_dir(path: Path, what: str, parser: argparse.ArgumentParser) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"{what} {str(path)!r}: {e.strerror}")
    if not os.access(path, os.W_OK | os.X_OK):
        parser.error(f"{what} {str(path)!r} is not writable")


def _cache_dir(given: Path | None, source: Path, parser: argparse.ArgumentParser) -> Path:
    """The cache directory to use (given, or the user's default), checked to lie outside the
    source tree (which is never written) and to be writable."""
    cache_dir = Path(given) if given is not None else default_cache_dir()
    real, src = os.path.realpath(cache_dir), os.path.realpath(source)
    if real == src or _inside(real, src):
        which = "cache directory" if given is not None else "default cache directory"
        parser.error(f"{which} {str(cache_dir)!r} is inside the source {str(source)!r}, which is never "
                     "written; choose another with --cache-dir")
    _check_writable_dir(cache_dir, "cache directory", parser)
    return cache_dir


def _check_strategy(spec: ShuffleSpec, parser: argparse.ArgumentParser) -> None:
    from .strategies import check_spec

    try:
        check_spec(spec)
    except ValueError as e:
        parser.error(f"strategy {spec.strategy!r}: {e}")


def _stage_dir(given: Path | None, spec: ShuffleSpec, src: Path, mnt: Path,
               parser: argparse.ArgumentParser) -> Path | None:
    """``--stage-dir``, checked: pls only, outside the source and the mount, writable."""
    if given is None:
        return None
    if spec.strategy != "pls":
        parser.error(f"--stage-dir keeps a rank's pls partition: it needs --strategy pls, not {spec.strategy!r}")
    from .view import _build_window

    if _build_window is None:
        parser.error("--stage-dir needs the compiled gather module (shufflefs/_gather.c); reinstall shufflefs")
    real = Path(os.path.realpath(given))
    for inside, what in ((src, "the source, which is never written"), (mnt, "the mount point")):
        if real == inside or _inside(str(real), str(inside)):
            parser.error(f"stage directory {str(given)!r} is inside {what}")
    _check_writable_dir(real, "stage directory", parser)
    return real


def mount_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[MountConfig, Resolved]:
    """Validate every mount option; exits with a usage error (2) on the first problem."""
    opts = resolve_options(args, MOUNT_KEYS, parser)
    v = opts.values
    src, mnt = Path(os.path.realpath(args.source)), Path(os.path.realpath(args.mountpoint))
    if v["rank"] >= v["world_size"]:
        parser.error(f"--rank {v['rank']} must be smaller than --world-size {v['world_size']}")
    spec = ShuffleSpec(
        strategy=v["strategy"], seed=v["seed"], block_size=v["block_size"], buffer=v["buffer"],
        page_size=v["page_size"], even=v["even"], exchange=v["exchange"], pls_local=v["pls_local"],
        balance=bool(v["balance"] or v["balance_field"]), balance_field=v["balance_field"],
        random_level=v["random_level"],
    )
    _check_strategy(spec, parser)
    cache_dir = Path(v["cache_dir"]) if v["cache_dir"] is not None else default_cache_dir()
    problem = check_paths(MountConfig(Path(args.source), Path(args.mountpoint), cache_dir=cache_dir))
    if problem:
        parser.error(problem)
    _check_writable_dir(cache_dir, "cache directory", parser)
    if v["log_file"] is not None:
        log = v["log_file"]
        if _inside(str(log), str(mnt)) or _inside(str(log), str(src)):
            parser.error(f"log file {str(log)!r} must be outside the source and the mount point")
        try:
            with open(log, "a"):
                pass
        except OSError as e:
            parser.error(f"log file {str(log)!r}: {e.strerror}")
    stage_dir = _stage_dir(v["stage_dir"], spec, src, mnt, parser)
    config = MountConfig(
        source=src, mountpoint=mnt, spec=spec, epoch=v["epoch"], rank=v["rank"], world=v["world_size"],
        rules=opts.rules, format_defaults=opts.format_defaults, cache_dir=cache_dir,
        pool=not v["no_pool"], pool_globs=opts.pools, stage_dir=stage_dir, verify=v["verify"],
    )
    if v["no_pool"] and opts.pools:
        parser.error("--pool declares a set but --no-pool turns pooling off")
    return config, opts


# --------------------------------------------------------------------------- mount


def cmd_mount(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    config, opts = mount_config(args, parser)
    v = opts.values
    log_file = str(v["log_file"]) if v["log_file"] is not None else None
    if v["foreground"] or args.ready_fd is not None:
        return run_foreground(config, args.ready_fd, log_file, v["verbose"])
    return start_background(argv, config, v["verbose"])


def run_foreground(config: MountConfig, ready_fd: int | None, log_file: str | None, verbosity: int) -> int:
    from . import daemon

    if ready_fd is not None:
        # Started by `start_background`: never pin the caller's working directory, and stop
        # writing to the start-up capture file once the parent has stopped reading it.
        os.chdir("/")
        ready_fd = _relay_ready(ready_fd, log_file)
    return daemon.run(config, ready_fd=ready_fd, log_file=log_file, verbosity=verbosity)


def _relay_ready(parent_fd: int, log_file: str | None) -> int:
    """Pass the daemon's "ready" on to the parent, first moving stdout/stderr off the capture file."""
    r, w = os.pipe()

    def relay() -> None:
        data = b""
        while b"ready" not in data:
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
        os.close(r)
        if b"ready" in data:
            sys.stdout.flush()
            sys.stderr.flush()
            out = os.open(log_file or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            os.write(parent_fd, b"ready\n")
        os.close(parent_fd)

    threading.Thread(target=relay, name="ready-relay", daemon=True).start()
    return w


def start_background(argv: list[str], config: MountConfig, verbosity: int) -> int:
    """Run ``shufflefs mount -f ...`` in a new session and return once it has mounted."""
    i = argv.index("mount")
    r, w = os.pipe()
    cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", "--ready-fd", str(w), *argv[i + 1:]]
    env = dict(os.environ)
    pkg_root = Path(__file__).resolve().parent.parent
    if pkg_root.name not in ("site-packages", "dist-packages"):  # a source checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pkg_root), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryFile() as capture:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=capture, stderr=capture, pass_fds=(w,),
                start_new_session=True, env=env,
            )
        finally:
            os.close(w)
        try:
            ready = _wait_ready(r)
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            print(f"{PROG} mount: interrupted; the daemon (pid {proc.pid}) was stopped", file=sys.stderr)
            return 130
        finally:
            os.close(r)
        if ready:
            if verbosity:
                print(f"{PROG}: mounted {config.source} on {config.mountpoint} (daemon pid {proc.pid})")
            return EXIT_OK
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        capture.seek(0)
        output = capture.read().decode(errors="replace").rstrip()
    if output:
        print(output, file=sys.stderr)
    status = "still running" if rc is None else f"exit status {rc}"
    print(f"{PROG} mount: error: the daemon failed to mount {config.mountpoint} ({status})", file=sys.stderr)
    return rc if rc else EXIT_FAIL


def _wait_ready(fd: int) -> bool:
    data = b""
    while b"ready" not in data:
        chunk = os.read(fd, 64)
        if not chunk:
            return False
        data += chunk
    return True


# --------------------------------------------------------------------------- xattr helpers


class CliError(Exception):
    """A failure to report as ``shufflefs CMD: error: ...``; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


def _xattr_failure(e: OSError, path: str, name: str) -> CliError:
    if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
        return CliError(f"{path}: not a shufflefs mount or a data file in one (no {name} attribute)")
    if e.errno == errno.ETIMEDOUT:
        return CliError(f"{path}: {e.strerror}; the daemon may be stopped or hung "
                        f"('{PROG} umount' still unmounts it)")
    if e.errno == errno.ENOTCONN:
        return CliError(f"{path}: the mount's daemon is gone (transport endpoint is not connected); "
                        f"run '{PROG} umount' on the mount point")
    if e.errno == errno.ENOENT:
        return CliError(f"{path}: no such file or directory")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CliError(f"{path}: {e.strerror} (changing the epoch needs write permission on it)")
    return CliError(f"{path}: {e.strerror or e}")


def get_xattr(path: str, name: str) -> bytes:
    try:
        return control.get_xattr(path, name)
    except OSError as e:
        raise _xattr_failure(e, path, name) from None


# --------------------------------------------------------------------------- epoch


def _parse_epoch(text: bytes | str, path: str) -> int:
    try:
        return int(text.decode() if isinstance(text, bytes) else text)
    except ValueError:
        raise CliError(f"{path}: unexpected epoch value {text!r}") from None


def cmd_epoch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    path = args.path
    current = _parse_epoch(get_xattr(path, EPOCH_XATTR).strip(), path)
    if args.value is None:
        print(current)
        return EXIT_OK
    if args.value == "next":
        new = current + 1
    else:
        try:
            new = _integer(0, MAX_EPOCH)(args.value.strip())
        except ValueError as e:
            parser.error(f"epoch {args.value!r}: {e} (or 'next')")
    try:
        control.set_xattr(path, EPOCH_XATTR, str(new).encode())
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CliError(f"{path}: invalid epoch {new} (rejected by the filesystem)", EXIT_USAGE) from None
        raise _xattr_failure(e, path, EPOCH_XATTR) from None
    if args.value == "next":
        print(new)
    return EXIT_OK


# --------------------------------------------------------------------------- umount


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as exited: it no longer holds the mount)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def cmd_umount(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    mnt = os.path.abspath(args.mountpoint)
    if control.mount_type(mnt) is None:  # from /proc/mounts: no stat a hung daemon would answer
        if not os.path.lexists(mnt):
            raise CliError(f"{mnt}: no such file or directory")
        raise CliError(f"{mnt}: not mounted")
    if not control.is_shufflefs(mnt):
        raise CliError(f"{mnt}: not a shufflefs mount")
    pid: int | None = None
    try:
        pid = int(control.get_xattr_apart(mnt, PID_XATTR).decode().strip())
    except (OSError, ValueError) as e:
        # the daemon is stopped, hung, gone, or its source was removed: unmount all the same
        print(f"{PROG} umount: {mnt}: the daemon did not tell its pid ({e}); unmounting anyway", file=sys.stderr)

    result = control.unmount(mnt, args.lazy)
    if result is None:
        raise CliError("neither fusermount3 nor umount was found")
    if result.returncode != 0 and control.is_shufflefs(mnt):
        detail = (result.stderr or result.stdout).strip() or f"{result.args[0]} exit status {result.returncode}"
        hint = ""
        if "busy" in detail.lower() or result.returncode == 124:
            hint = ("\n  a process has a file open or its working directory under the mount, or the daemon "
                    f"does not answer; close it, or detach now with '{PROG} umount --lazy {args.mountpoint}'")
        raise CliError(f"cannot unmount {mnt}: {detail}{hint}")

    if pid is not None and args.lazy:
        time.sleep(0.2)
        if _alive(pid):
            print(f"{PROG} umount: {mnt} detached; its daemon (pid {pid}) exits when the last open file "
                  "under it is closed", file=sys.stderr)
    elif pid is not None:
        deadline = time.monotonic() + args.timeout
        while _alive(pid):
            if time.monotonic() >= deadline:
                raise CliError(f"{mnt} is unmounted but its daemon (pid {pid}) has not exited after {args.timeout:g} s")
            time.sleep(0.05)
    return EXIT_OK


# --------------------------------------------------------------------------- index


class ProgressBar:
    """One self-overwriting stderr line: files done / total, bytes, MB/s; silent unless a TTY."""

    def __init__(self, files: int, total_bytes: int, enabled: bool) -> None:
        self.files, self.total = files, total_bytes
        self.enabled = enabled
        self.done_files = 0
        self.done_bytes = 0
        self.current = 0
        self.start = time.monotonic()
        self._last = 0.0
        self._width = 0

    def file_progress(self, scanned: int) -> None:
        self.current = scanned
        self.draw()

    def file_done(self, size: int) -> None:
        self.done_files += 1
        self.done_bytes += size
        self.current = 0
        self.draw()

    def draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1 and self.done_files < self.files:
            return
        self._last = now
        done = self.done_bytes + self.current
        rate = done / max(now - self.start, 1e-9)
        line = f"{self.done_files}/{self.files} files  {_human(done)} / {_human(self.total)}  {_human(rate)}/s"
        sys.stderr.write("\r" + line.ljust(self._width))
        sys.stderr.flush()
        self._width = len(line)

    def clear(self) -> None:
        if self.enabled and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
            self._width = 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def iter_source_files(source: Path) -> list[tuple[str, str]]:
    """(path, path relative to source) of every regular file the mount serves as itself, sorted.

    Symlinks are skipped: the mount shows them as links to files indexed under their own path.
    """
    out = []
    for root, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                out.append((path, os.path.relpath(path, source)))
    return out


def cmd_index(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .errors import ShuffleError
    from .formats import resolve_format
    from .index import IndexCache

    opts = resolve_options(args, FORMAT_KEYS, parser)
    if not os.path.isdir(args.source):
        parser.error(f"source {args.source!r} is not a directory")
    source = Path(os.path.realpath(args.source))
    cache = IndexCache(_cache_dir(opts.values["cache_dir"], source, parser))

    jobs = []
    skipped = 0
    failures: list[str] = []
    for path, rel in iter_source_files(source):
        try:
            fmt = resolve_format(rel, opts.rules, opts.format_defaults)
        except (ShuffleError, ValueError) as e:
            failures.append(f"{path}: {e}")
            print(f"{PROG} index: {failures[-1]}", file=sys.stderr)
            continue
        if fmt is None:
            skipped += 1
            continue
        jobs.append((path, fmt, os.path.getsize(path)))

    bar = ProgressBar(len(jobs), sum(j[2] for j in jobs), sys.stderr.isatty())
    records = cached = built = 0
    reported = len(failures)
    try:
        for path, fmt, size in jobs:
            try:
                index, was_cached = _load_index(path, fmt, cache, bar.file_progress)
            except ShuffleError as e:
                failures.append(str(e))
            except OSError as e:
                failures.append(f"{path}: {e.strerror or e}")
            else:
                records += index.n
                cached += was_cached
                built += not was_cached
            if len(failures) > reported:
                bar.clear()
                print(f"{PROG} index: {failures[-1]}", file=sys.stderr)
                reported = len(failures)
            bar.file_done(size)
    finally:
        bar.clear()
    elapsed = time.monotonic() - bar.start
    print(
        f"{len(jobs)} files, {records} records, {_human(bar.total)}: {built} built, {cached} cached, "
        f"{len(failures)} failed, {skipped} skipped (no format) in {elapsed:.1f} s"
    )
    return EXIT_FAIL if failures else EXIT_OK


def _load_index(path: str, fmt: Any, cache: Any, progress: Callable[[int], None]) -> tuple[Any, bool]:
    """(index, True if it came from the cache)."""
    from .formats import load_or_build_index
    from .index import SourceStamp, cache_key

    stamp = SourceStamp.of(os.stat(path))
    index = cache.load(cache_key(path, stamp, fmt.name, fmt.params()), stamp)
    if index is not None:
        return index, True
    return load_or_build_index(path, fmt, cache, progress=progress), False


# --------------------------------------------------------------------------- stat


def cmd_stat(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    raw = get_xattr(args.mountpoint, STATS_XATTR)
    try:
        stats = json.loads(raw)
    except ValueError:
        raise CliError(f"{args.mountpoint}: unreadable stats: {raw[:200]!r}") from None
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(format_stats(stats))
    return EXIT_OK


def format_stats(stats: dict) -> str:
    """Readable lines for the known fields of ``user.shufflefs.stats``; any others are listed after."""
    s = dict(stats)
    take = s.pop
    lines: list[tuple[str, str]] = []

    pid, uptime = take("pid", None), take("uptime_s", None)
    about = ", ".join(x for x in (pid is not None and f"daemon pid {pid}", uptime is not None and f"up {_duration(uptime)}") if x)
    lines.append(("mount", f"{take('mountpoint', '?')}" + (f"  ({about})" if about else "")))
    if "source" in s:
        lines.append(("source", str(take("source"))))
    params = [f"{k}={_param(k, take(k))}" for k in ("seed", "block_size", "buffer", "page_size") if k in s]
    lines.append(("strategy", "  ".join([str(take("strategy", "?")), *params])))
    rank, world, even = take("rank", None), take("world", None), take("even", "none")
    balance, field, level = take("balance", False), take("balance_field", None), take("random_level", 0.0)
    if world is not None and world != 1:
        lines.append(("rank", f"{rank} of {world}" + (f"  (even={even})" if even != "none" else "")))
    if balance:
        lines.append(("balance", f"by {field or 'byte length'}  random_level={level}"))
    for name, blocks in (take("few_blocks", None) or {}).items():
        lines.append(("few blocks", f"{name}: {blocks} block(s) of the --block-size given: block and corgipile "
                                    "barely shuffle it; lower --block-size (or leave it auto)"))
    pooling, globs = take("pooling", None), take("pool_globs", None) or []
    if pooling is not None:
        lines.append(("pools", ("shard sets by name" + (", declared: " + ", ".join(globs) if globs else ""))
                      if pooling else "off (every file shuffled alone)"))
    for relpath, counts in (take("pls_exchange", None) or {}).items():
        lines.append(("pls exchange", f"{relpath}: {counts}"))
    staging = take("staging", None)
    for epoch, got in (take("read_bytes", None) or {}).items():
        stage = f", from stages {_human(got.get('stage_bytes', 0))}" if staging is not None else ""
        lines.append(("read", f"epoch {epoch}: from the source {_human(got.get('source_bytes', 0))}{stage}"))
    if isinstance(staging, dict):
        lines.append(("stage dir", f"{staging.get('dir')}  ({staging.get('built', 0)} built, {staging.get('failed', 0)} failed)"))
        for st in staging.get("stages", []):
            lines.append(("stage", f"{st['name']} epoch {st['epoch']}: {st['records']} records, "
                                   f"{_human(st['bytes'])}, {st['readers']} readers"))
    overrides = take("epoch_overrides", None)
    epoch = str(take("epoch", "?"))
    if overrides:
        epoch += "  (own epochs: " + ", ".join(f"{k}={v}" for k, v in overrides.items()) + ")"
    lines.append(("epoch", epoch))
    counts = [f"{take(k)} {label}" for k, label in (("files_opened", "opened"), ("views", "views"),
                                                     ("handles", "open handles"), ("inodes", "inodes")) if k in s]
    if counts:
        lines.append(("files", ", ".join(counts)))
    if "bytes_served" in s or "reads" in s:
        served = take("bytes_served", 0)
        lines.append(("served", f"{_human(served) if isinstance(served, (int, float)) else served} in {take('reads', '?')} reads"))
    memory = take("memory", None)
    if isinstance(memory, dict):
        lines.append(("memory", "  ".join(f"{k.removesuffix('_bytes')}={_human(v) if k.endswith('_bytes') else v}" for k, v in memory.items())))
    if "cache_dir" in s:
        lines.append(("cache dir", str(take("cache_dir"))))
    recent = take("last_errors", None)
    errors_ = take("errors", None)
    for key, value in s.items():
        if isinstance(value, dict):
            value = "  ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        lines.append((key.replace("_", " "), str(value)))
    if errors_ is not None:
        lines.append(("errors", str(errors_)))
    width = max(len(k) for k, _ in lines)
    out = [f"{k:<{width}}  {v}".rstrip() for k, v in lines]
    if recent:
        out.append("recent errors:")
        out.extend(f"  {line}" for line in (recent if isinstance(recent, list) else [recent]))
    return "\n".join(out)


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _param(key: str, value: Any) -> str:
    if key == "buffer" and isinstance(value, float):
        return format_buffer(value)
    if key in ("block_size", "buffer") and isinstance(value, int):
        for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value >= 1 << shift and value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    return str(value)


# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .demo import run_demo

    return run_demo(args.dir, keep=args.keep)


# --------------------------------------------------------------------------- inspect

INFO_XATTR = XATTR_PREFIX + "info"
INSPECT_SHUFFLE_KEYS = ("block_size", "buffer", "seed", "page_size")
INSPECT_KEYS = (*INSPECT_SHUFFLE_KEYS, "epoch", *FORMAT_KEYS)


def _add_inspect_parser(sub: Any, subs: dict[str, argparse.ArgumentParser], strategies: str) -> None:
    p = subs["inspect"] = sub.add_parser(
        "inspect", help="measure how well a file's records are shuffled, per strategy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure the shuffle quality of a file's record order against a uniform shuffle.\n"
        "PATH in a shufflefs mount: the order its view delivers (the mount's strategy, seed and\n"
        "current epoch). PATH a source file: the orders of --strategies, without mounting.",
        epilog=f"strategies:\n{strategies}\n\n"
        "metrics: rank correlation of source and output position (1 unshuffled, ~0 random); total\n"
        "variation distance of each window's label mix from the whole file's (0 = perfect mix);\n"
        "entropy of successive id gaps (MosaicML Streaming's measure); share of in-batch record\n"
        "pairs from one source block. Columns 'uniform' (a seeded uniform permutation) and\n"
        "'expected' (its exact expectation, where one exists) are the reference.",
    )
    p.add_argument("path", metavar="PATH", help="a data file inside a shufflefs mount, or a source data file")
    g = p.add_argument_group("orders to compare (source files; a mount's view has its own)")
    g.add_argument("--strategies", metavar="S[@BUFFER],...",
                   help="comma-separated strategies, each optionally with its own buffer, e.g. "
                   "'none,full,corgipile,corgipile@2%%' (default: all)")
    g.add_argument("--block-size", metavar="SIZE|auto", help="bytes per block (default auto: per file, up to 1/64 of its record bytes, 4KiB..4MiB)")
    g.add_argument("--buffer", metavar="SIZE|P%", help="shuffle buffer, bytes or a share of the record bytes (default 64MiB)")
    g.add_argument("--seed", metavar="N", help="seed (default 0)")
    g.add_argument("--page-size", metavar="SIZE", help="page size of lirs-page (default 4096)")
    p.add_argument("--epoch", metavar="N", help="epoch to measure (default: the view's current epoch, or 0)")
    _add_format_options(p)
    g = p.add_argument_group("labels (for the label-mix metric and picture)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--label-field", metavar="F", help="top-level field of JSON Lines records")
    x.add_argument("--label-column", metavar="NAME|INDEX", help="CSV/TSV column (header name or 0-based index), or .npy column (index or field name)")
    x.add_argument("--label-byte", metavar="OFFSET", help="byte at OFFSET of every record (fixed-size records)")
    g = p.add_argument_group("output")
    g.add_argument("--window", metavar="K", default="100", help="records per window of the label-mix metric (default 100)")
    g.add_argument("--batch", metavar="B", default="32", help="records per batch of the same-block metric (default 32)")
    g.add_argument("--png", metavar="OUT.png", help="draw every order (record id by position; label counts per 20 records); needs matplotlib")
    g.add_argument("--json", action="store_true", help="print the results as JSON")
    g.add_argument("--verify", action="store_true",
                   help="(mounted PATH) also read the view and check that it holds exactly the bytes of the order reported")


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


def _parse_strategy_list(text: str | None, parser: argparse.ArgumentParser) -> list[tuple[str, str, int | float | None]]:
    """``none,corgipile@2%`` -> [(column name, strategy, buffer or None)]."""
    from .strategies import STRATEGIES

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


def _mount_root(path: str) -> str | None:
    """The root of the shufflefs mount holding ``path`` (the directory with the stats attribute)."""
    d = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            os.getxattr(d, STATS_XATTR)
            return d
        except OSError:
            pass
        if os.path.ismount(d) or d == os.path.dirname(d):
            return None
        d = os.path.dirname(d)


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
    from .index import SourceStamp

    if index.stamp is not None and SourceStamp.of(os.stat(path)) != index.stamp:
        raise CliError(f"{path}: the file changed while it was being inspected; run again")


def _inspect_mounted(args: argparse.Namespace, parser: argparse.ArgumentParser, info: dict) -> _Inspected:
    """Rebuild the plan of a mounted view from its attributes and the source file."""
    from .costs import record_costs
    from .formats import load_or_build_index, make_format
    from .index import IndexCache
    from .strategies import make_plan

    given = [k for k in (*INSPECT_SHUFFLE_KEYS, "format", "record_size", "header_bytes", "cache_dir", "config", "strategies")
             if getattr(args, k, None)]
    if given:
        parser.error(f"{_cli_name(given[0])} does not apply to a mounted view: the mount chose its order "
                     "(inspect the source file to compare other settings)")
    root = _mount_root(args.path)
    if root is None:
        raise CliError(f"{args.path}: cannot find the root of its shufflefs mount")
    if "pool" in info:
        raise CliError(f"{args.path}: shard {info.get('shard')} of the pool {info['pool']!r}; inspect analyses "
                       "the order of one file (inspect a member in the source, or mount with --no-pool)")
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
    index = load_or_build_index(source, fmt, IndexCache(Path(stats["cache_dir"])))
    costs = record_costs(str(source), index, spec.balance_field, fmt.name) if spec.balance else None
    plan = make_plan(index, spec, epoch, rank, world, part, parts, costs=costs)
    name = (f"{spec.strategy}" + (f" rank {rank}/{world}" if world > 1 else "")
            + (f" part {part}/{parts}" if parts > 1 else ""))
    return _Inspected(source, fmt, index, spec, epoch, {name: plan})


def _inspect_cache(given: Path | None, parent: Path, parser: argparse.ArgumentParser) -> Any:
    """The index cache for a source file, or None to scan without one (the default cache directory
    lies inside the file's directory, or cannot be written)."""
    from .index import IndexCache, default_cache_dir

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
    from .errors import ShuffleError
    from .formats import load_or_build_index, resolve_format, scan_file
    from .strategies import make_plan

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
    return _Inspected(path, fmt, index, base, v["epoch"], plans)


def _label_source(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    from .labels import BYTE, COLUMN, FIELD, LabelSource

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
    from .layout import render

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
    if int(info["epoch"]) != got.epoch:
        raise CliError(f"{path}: the epoch changed to {info['epoch']} while inspecting epoch {got.epoch}; run again")
    (plan,) = got.plans.values()
    expected = render(got.index, plan, got.data)
    if view != expected:
        import numpy as np

        n = min(len(view), len(expected))
        diff = np.flatnonzero(np.frombuffer(view[:n], np.uint8) != np.frombuffer(expected[:n], np.uint8))
        where = f"first at byte {int(diff[0])}" if len(diff) else f"sizes {len(view)} and {len(expected)}"
        raise CliError(f"{path}: VERIFY FAILED: the view is not the order reported ({where})")


def cmd_inspect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .errors import ShuffleError
    from .labels import extract_labels, read_source
    from .quality import block_of_records, format_report, report

    try:
        k, batch = _integer(1)(args.window), _integer(1)(args.batch)
    except ValueError as e:
        parser.error(f"argument --window/--batch: {e}")
    label_source = _label_source(args, parser)
    if args.png:
        from .plots import have_matplotlib

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
        if label_source is not None or args.verify:
            got.data = read_source(got.source)
            _check_stamp(got.source, got.index)
        if label_source is not None:
            labels = extract_labels(got.index, got.fmt.name, got.data, label_source, str(got.source))
        if args.verify:
            _verify_view(args.path, got)
    except ShuffleError as e:
        raise CliError(str(e)) from None
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    except OSError as e:
        raise CliError(f"{e.filename or args.path}: {e.strerror or e}") from None

    orders = {name: _order_of(plan) for name, plan in got.plans.items()}
    notes = {name: _plan_note(plan) for name, plan in got.plans.items()}
    blocks = block_of_records(got.index.bounds, got.spec.block_size)
    rep = report(orders, labels.codes if labels else None, blocks, k, batch,
                 labels.names if labels else None)
    rep.notes = notes
    where = (f"{args.path} (view of {got.source}, epoch {got.epoch}, seed {got.spec.seed})" if mounted
             else f"{got.source} (epoch {got.epoch}, seed {got.spec.seed})")
    if args.png:
        from .plots import plot_orders

        title = f"{os.path.basename(args.path)}: {rep.records} records, epoch {got.epoch}, seed {got.spec.seed}, " \
                f"block {_param('block_size', got.spec.block_size)}"
        try:
            plot_orders(orders, args.png, labels.codes if labels else None, labels.names if labels else None,
                        title=title, subtitles=notes)
        except OSError as e:
            raise CliError(f"{args.png}: {e.strerror or e}") from None
    if args.json:
        out = {"path": os.path.abspath(args.path), "source": str(got.source), "mounted": mounted,
               "format": got.fmt.name, "epoch": got.epoch, "seed": got.spec.seed,
               "block_size": got.spec.block_size, "page_size": got.spec.page_size,
               "label": label_source.describe() if label_source else None,
               "verified": bool(args.verify), **rep.to_json()}
        print(json.dumps(out, indent=2))
        return EXIT_OK
    label_text = ""
    if labels is not None:
        import numpy as np

        counts = np.bincount(labels.codes, minlength=labels.n_labels)
        shown = ", ".join(f"{n}={c}" for n, c in zip(labels.names[:10], counts[:10].tolist()))
        label_text = f", {labels.n_labels} labels by {label_source.describe()} ({shown}{', ...' if labels.n_labels > 10 else ''})"
    print(f"{where}")
    print(f"{rep.records} records in {rep.blocks or 0} blocks of {_param('block_size', got.spec.block_size)}{label_text}")
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


# --------------------------------------------------------------------------- advise


def _add_advise_parser(sub: Any, subs: dict[str, argparse.ArgumentParser]) -> None:
    p = subs["advise"] = sub.add_parser(
        "advise", help="measure the storage under SRC and recommend --block-size and --buffer",
        description="Time random reads of 4 KiB to 16 MiB against a sequential read on the files "
        "under SRC (O_DIRECT, so the page cache cannot serve them; SRC is only read), then "
        "recommend the smallest block size reaching about 90% of sequential throughput and a "
        "buffer for a memory budget.",
    )
    p.add_argument("source", metavar="SRC", help="dataset directory (its largest files are read)")
    p.add_argument("--budget", metavar="SIZE", default="1GiB",
                   help="memory the daemon may use per file read at once (default 1GiB); the buffer is a third of it")
    p.add_argument("--seconds", metavar="S", default="5", help="time to spend measuring (default 5)")


def cmd_advise(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .advise import AdviseError, format_report, probe, recommend

    if not os.path.isdir(args.source):
        parser.error(f"source {args.source!r} is not a directory")
    try:
        budget = _size(args.budget)
    except ValueError as e:
        parser.error(f"argument --budget: {e}")
    try:
        seconds = float(args.seconds)
    except ValueError:
        parser.error(f"argument --seconds: not a number: {args.seconds!r}")
    if not 0 < seconds <= 3600:
        parser.error(f"argument --seconds: must be in (0, 3600]: {args.seconds!r}")
    try:
        result = probe(args.source, seconds=seconds)
        advice = recommend(result, budget)
    except AdviseError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"{e.filename or args.source}: {e.strerror or e}") from None
    print(format_report(result, advice))
    return EXIT_OK


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subs = build_parser()
    args = parser.parse_args(argv)
    sub = subs[args.command]
    try:
        if args.command == "mount":
            return cmd_mount(args, sub, argv)
        handler = {
            "epoch": cmd_epoch, "umount": cmd_umount, "index": cmd_index, "stat": cmd_stat,
            "demo": cmd_demo, "inspect": cmd_inspect, "advise": cmd_advise,
        }[args.command]
        return handler(args, sub)
    except CliError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
