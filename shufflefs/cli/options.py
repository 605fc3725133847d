"""The mount options, one table for the command line, config files and the mount helper, and their parsing."""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import (
    MAX_BLOCK,
    MAX_EPOCH,
    MAX_MIX_SHARDS,
    MAX_PAGE,
    MAX_SEED,
    MAX_SIZE,
    MAX_WORLD,
    MIN_BLOCK,
    MIN_BUFFER,
    MIN_BUFFER_FRACTION,
    MIN_PAGE,
    MixSource,
    MixSpec,
    STAGE_WAIT,
    format_size,
    parse_buffer,
    parse_size,
)
from ..serve.access import SETTERS
from ..sources.cache_mode import SOURCE_CACHE_MODES
from ..serve.passthrough import PASSTHROUGH_MODES
from ..stages.decoded import DECODED_COPY_MODES
from ..strategies.base import EVEN_MODES, LOCAL_MODES
from .common import _message

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
        bare = isinstance(value, (str, int)) and str(value).strip().isdigit()
        hint = f" (a share of each file's record bytes is {str(value).strip()}%, mebibytes {str(value).strip()}MiB)" if bare else ""
        raise ValueError(f"a buffer must be between {format_size(MIN_BUFFER)} and {format_size(MAX_SIZE)}: {value!r}{hint}")
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


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {value!r}")
    return value


def _s3_url(value: Any) -> str:
    from ..sources.s3 import parse_url

    if not isinstance(value, str):
        raise ValueError(f"not an s3://BUCKET/PREFIX URL: {value!r}")
    parse_url(value)  # ValueError says what is wrong
    return value


def _strategy(value: Any) -> str:
    from ..strategies import STRATEGIES

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


def _number_in(lo: float, hi: float, what: str) -> Callable[[Any], float]:
    """A real number option within ``[lo, hi]`` (``what`` names it in errors)."""
    def convert(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(f"not {what}: {value!r}")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"not {what}: {value!r}") from None
        if not lo <= x <= hi:
            raise ValueError(f"must be {what} in [{lo:g}, {hi:g}]: {value!r}")
        return x

    return convert


_fraction = _number_in(0.0, 1.0, "a fraction")
_seconds = _number_in(0.1, 3600.0, "a number of seconds")


def _one_of(modes: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in modes:
            raise ValueError(f"must be one of {', '.join(modes)}: {value!r}")
        return str(value)

    return convert


MiB = 1 << 20
VERIFY_MODES = ("frames", "index")

OPTIONS: dict[str, _Option] = {
    "strategy": _Option(_strategy, "stratified"),
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
    "source_cache": _Option(_one_of(SOURCE_CACHE_MODES), "auto"),
    "decoded_copies": _Option(_one_of(DECODED_COPY_MODES), "auto"),
    "passthrough": _Option(_one_of(PASSTHROUGH_MODES), "auto"),
    "stage_wait": _Option(_number_in(0.0, 3600.0, "a number of seconds"), STAGE_WAIT),
    "balance": _Option(_flag, False),
    "balance_field": _Option(_field, None),
    "random_level": _Option(_fraction, 0.0),
    "cache_dir": _Option(_path, None),
    "no_pool": _Option(_flag, False),
    "direct_io": _Option(_flag, False),
    "page_cache": _Option(_flag, False),
    "python_replies": _Option(_flag, False),
    "reply_threads": _Option(_auto_or(_integer(0, 64)), None),
    "allow_other": _Option(_flag, False),
    "epoch_setters": _Option(_one_of(SETTERS), "owner"),
    "record_size": _Option(_size_in(1, MAX_BLOCK), None),
    "header_bytes": _Option(_size_or_zero, None),
    "log_file": _Option(_path, None),
    "endpoint_url": _Option(_url, None, "AWS_ENDPOINT_URL"),
    "region": _Option(_field, None),
    "requests": _Option(_integer(1, 256), 16),
    "request_timeout": _Option(_seconds, 30.0),
    "retries": _Option(_integer(0, 20), 4),
    "index_url": _Option(_s3_url, None),
    "index_dir": _Option(_path, None),
    "listing_ttl": _Option(_seconds, None),
    "verbose": _Option(_integer(0), 0),
    "foreground": _Option(_flag, False),
}
"""Options that a ``--config`` file may also set (as top-level keys, dashes or underscores)."""

FORMAT_KEYS = ("cache_dir", "record_size", "header_bytes")
PATH_KEYS = ("cache_dir", "log_file", "stage_dir", "index_dir")
"""Relative paths in a config file are relative to the file's directory."""
MOUNT_KEYS = tuple(OPTIONS)
STORE_KEYS = {"endpoint_url": "endpoint_url", "region": "region", "requests": "in_flight",
              "request_timeout": "timeout_s", "retries": "retries", "index_url": "index_url",
              "listing_ttl": "listing_ttl"}
"""Options of object-store sources (s3://): option key -> keyword of the store's class."""


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
    mixes: list[MixSpec] = field(default_factory=list)
    """``[[mix]]`` tables, in file order."""


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
    mixes: list[MixSpec] = []
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
        elif key == "mix":
            tables = value if isinstance(value, list) else [value]
            for i, table in enumerate(tables):
                mixes.append(_mix_table(table, f"{where}: [[mix]] #{i + 1}"))
            names = [m.name for m in mixes]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{where}: two [[mix]] tables are named {twice[0]!r}")
        elif key in OPTIONS:
            values[key] = value
        else:
            known = ", ".join(sorted([*OPTIONS, "format", "pool", "mix"]))
            raise ValueError(f"{where}: unknown key {raw_key!r} (known: {known})")
    return ConfigFile(values, formats, pools, mixes)


_MIX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def _mix_table(table: Any, where: str) -> MixSpec:
    """A ``[[mix]]`` table: ``name``, ``samples``, ``shards`` and its ``[[mix.source]]`` tables."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table with keys name, samples, shards and [[mix.source]] tables")
    unknown = set(table) - {"name", "samples", "shards", "source"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: name, samples, shards, source)")
    name = table.get("name")
    if not isinstance(name, str) or not _MIX_NAME.fullmatch(name):
        raise ValueError(f"{where}: 'name' must be letters, digits, '_', '-' or '.' (not first), at most 100: {name!r}")
    where = f"{where} ({name})"
    samples, shards = table.get("samples"), table.get("shards")
    for key, value in (("samples", samples), ("shards", shards)):
        if value is not None and type(value) is not int:  # TOML gives numbers typed: "100" is a string
            raise ValueError(f"{where}: {key!r} must be an integer, written without quotes: {value!r}")
    try:
        samples = None if samples is None else _integer(1, 2**62)(samples)
        shards = None if shards is None else _integer(1, MAX_MIX_SHARDS)(shards)
    except ValueError as e:
        raise ValueError(f"{where}: samples and shards: {e}") from None
    sources = table.get("source")
    if not isinstance(sources, list) or not sources:
        raise ValueError(f"{where}: needs at least one [[mix.source]] table with a glob and a weight")
    out = []
    for i, src in enumerate(sources):
        at = f"{where}: [[mix.source]] #{i + 1}"
        if not isinstance(src, dict):
            raise ValueError(f"{at}: must be a table with keys glob and weight")
        if set(src) - {"glob", "weight"}:
            unknown = ", ".join(sorted(set(src) - {"glob", "weight"}))
            raise ValueError(f"{at}: unknown key(s) {unknown} (known: glob, weight)")
        glob, weight = src.get("glob"), src.get("weight", 1)
        if not isinstance(glob, str) or not glob:
            raise ValueError(f"{at}: 'glob' must be a non-empty string")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{at}: 'weight' must be a number >= 0: {weight!r}")
        out.append(MixSource(glob, float(weight)))
    if sum(s.weight for s in out) <= 0:
        raise ValueError(f"{where}: the weights add up to 0; at least one must be positive")
    return MixSpec(name, tuple(out), samples, shards)


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


# --------------------------------------------------------------------------- resolving options


@dataclass
class Resolved:
    values: dict[str, Any]
    rules: list[Any]
    """`shufflefs.formats.FormatRule`s: command line first, then the config file's."""
    pools: list[str] = field(default_factory=list)
    """Declared pool globs: command line first, then the config file's."""
    mixes: list[MixSpec] = field(default_factory=list)
    """The config file's mixtures."""

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

    from ..formats import parse_format_option

    rules = []
    for text in [*args.format, *cfg.formats]:
        try:
            rules.append(parse_format_option(text, _format_defaults(values)))
        except (ValueError, KeyError, TypeError) as e:
            parser.error(f"argument --format: {_message(e)}")
    return Resolved(values, rules, [*getattr(args, "pool", []), *cfg.pools], cfg.mixes)


INSPECT_SHUFFLE_KEYS = ("block_size", "buffer", "seed", "page_size")
INSPECT_KEYS = (*INSPECT_SHUFFLE_KEYS, "epoch", *FORMAT_KEYS)
