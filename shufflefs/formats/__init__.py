"""Record formats, the rules that pick one per file, and building (or loading) a file's index.

Which format a file gets: the first `FormatRule` whose glob matches its path relative to the
mount root (or its basename), else its extension; files of no known format pass through
unshuffled.  `build` runs the scans in worker processes, so that a bad file costs a worker, never
the mount.  Imports `errors`, `index` (a scan's result) and `resolve` only.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import logging
import mmap
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import FormatError, StaleSourceError
from .. import resolve
from ..index.table import IndexCache, RecordIndex, SourceStamp, cache_key
from .base import Format, FramingError, Progress
from .framing import gather_check
from .fixed import FixedFormat  # re-exported for convenience; the registry is MODULES
from .lines import CsvFormat, LinesFormat
from .npy import NpyFormat
from .tfrecord import TFRecordFormat

__all__ = [
    "FORMATS",
    "PASSTHROUGH",
    "CsvFormat",
    "FixedFormat",
    "Format",
    "FormatRule",
    "FramingError",
    "LinesFormat",
    "NpyFormat",
    "TFRecordFormat",
    "load_or_build_index",
    "check_file_index",
    "format_suffix",
    "gather_check",
    "make_format",
    "parse_format_option",
    "resolve_format",
    "scan_file",
]

log = logging.getLogger(__name__)

MODULES = (
    "lines",
    "fixed",
    "npy",
    "tfrecord",
    "tar",
    "compressed",
    "parquet",
)
"""The format registry: modules of this package, each listing its formats in ``FORMATS``.  A new
format is one module and one line here."""


def _registry() -> tuple[dict[str, type[Format]], dict[str, tuple[str, dict]]]:
    formats: dict[str, type[Format]] = {}
    suffixes: dict[str, tuple[str, dict]] = {}
    for module in MODULES:
        for cls in importlib.import_module(f".{module}", __name__).FORMATS:
            if cls.name in formats:
                raise ImportError(f"format {cls.name!r} registered twice")
            formats[cls.name] = cls
            for ext, params in cls.extensions.items():
                if ext in suffixes:
                    raise ImportError(f"extension {ext!r} claimed by {suffixes[ext][0]!r} and {cls.name!r}")
                suffixes[ext] = (cls.name, dict(params))
    return formats, suffixes


FORMATS, _BY_EXTENSION = _registry()
"""Format classes by name, and file suffixes with the format and parameters they imply."""

PASSTHROUGH = frozenset({"none", "passthrough"})
"""Format names a rule can use to serve matching files unchanged."""


def _accepted(cls: type[Format]) -> dict[str, inspect.Parameter]:
    params = inspect.signature(cls.__init__).parameters
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: p for k, p in params.items() if k != "self" and p.kind in kinds}


def make_format(name: str, params: Mapping[str, object] | None = None) -> Format:
    """Instantiate format ``name``; ValueError names the unknown format or parameter."""
    params = dict(params or {})
    cls = FORMATS.get(name)
    if cls is None:
        known = ", ".join(sorted(FORMATS) + sorted(PASSTHROUGH))
        raise ValueError(f"unknown format {name!r} (known: {known})")
    accepted = _accepted(cls)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        allowed = ", ".join(accepted) or "none"
        raise ValueError(f"format {name!r} has no parameter {', '.join(map(repr, unknown))} (parameters: {allowed})")
    missing = [k for k, p in accepted.items() if p.default is p.empty and k not in params]
    if missing:
        raise ValueError(f"format {name!r} needs {', '.join(missing)} (e.g. {name}:{missing[0]}=...)")
    try:
        return cls(**params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"format {name!r}: {e}") from None


@dataclass(frozen=True)
class FormatRule:
    """Files matching ``glob`` use ``format`` (a `FORMATS` name, or "none"/"passthrough").

    The glob is matched case-sensitively against the relative path and against the basename;
    ``*`` also spans ``/``, so ``*.bin`` matches ``a/b/x.bin``.
    """

    glob: str
    format: str
    params: dict = field(default_factory=dict)

    def matches(self, relpath: str) -> bool:
        return fnmatch.fnmatchcase(relpath, self.glob) or fnmatch.fnmatchcase(os.path.basename(relpath), self.glob)


def _with_defaults(name: str, params: Mapping[str, object], defaults: Mapping[str, object]) -> dict:
    """Global defaults (e.g. ``record_size``) fill the parameters a format accepts and a rule left out."""
    accepted = _accepted(FORMATS[name]) if name in FORMATS else {}
    merged = {k: v for k, v in defaults.items() if k in accepted}
    merged.update(params)
    return merged


def resolve_format(relpath: str, rules: Sequence[FormatRule], defaults: Mapping[str, object] | None = None) -> Format | None:
    """The format for the file at ``relpath`` (relative to the mount root); None means pass-through.

    ``defaults`` may carry ``record_size`` (which turns ``.bin`` files into fixed-size records)
    and ``header_bytes``, and fill any parameter a matching rule leaves out.
    """
    defaults = defaults or {}
    relpath = relpath.replace(os.sep, "/").lstrip("/")
    while relpath.startswith("./"):
        relpath = relpath[2:]
    for rule in rules:
        if rule.matches(relpath):
            if rule.format in PASSTHROUGH:
                return None
            return make_format(rule.format, _with_defaults(rule.format, rule.params, defaults))
    hit = _BY_EXTENSION.get(format_suffix(relpath))
    if hit is None:
        return None
    name, params = hit
    if _lacking(name):
        return None  # its codec's library is missing: served as it is
    params = _with_defaults(name, params, defaults)
    if any(p.default is p.empty and k not in params for k, p in _accepted(FORMATS[name]).items()):
        return None  # e.g. ``.bin`` without a record size: nothing says where records end
    return make_format(name, params)


def format_suffix(relpath: str) -> str:
    """The suffix that decides a file's format by extension: its last two (``.jsonl.gz``) where
    a format claims them, else its last (``.jsonl``), lower case."""
    name = os.path.basename(relpath).lower()
    stem, last = os.path.splitext(name)
    both = os.path.splitext(stem)[1] + last
    return both if both != last and both in _BY_EXTENSION else last


_LACKING_LOGGED: set[str] = set()


def _lacking(name: str) -> bool:
    """Whether format ``name`` needs a library that is missing (logged once per format)."""
    available = getattr(FORMATS[name], "available", None)
    lacking = available() if available is not None else None
    if lacking is not None and name not in _LACKING_LOGGED:
        _LACKING_LOGGED.add(name)
        log.warning("%s files pass through unchanged: %s is not installed (pip install 'shufflefs[compressed]')",
                    name, lacking)
    return lacking is not None


def _parse_value(text: str) -> object:
    low = text.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(text, 0)
    except ValueError:
        return text


def parse_format_option(text: str, defaults: Mapping[str, object] | None = None) -> FormatRule:
    """Parse ``GLOB=NAME[:key=value,...]``, e.g. ``*.rec=fixed:record_size=128,header_bytes=16``.

    Values become ints (``0x`` prefixes allowed) or booleans where they look like one.  The rule is
    checked by building its format (with ``defaults`` filling missing parameters), so a typo fails
    at the command line rather than at the first matching file.
    """
    glob, sep, spec = text.partition("=")
    glob = glob.strip()
    if not sep or not glob:
        raise ValueError(f"bad format rule {text!r}: expected GLOB=FORMAT[:key=value,...], e.g. '*.rec=fixed:record_size=128'")
    name, _, arglist = spec.partition(":")
    name = name.strip().lower()
    if not name:
        raise ValueError(f"bad format rule {text!r}: no format name after '='")
    params: dict[str, object] = {}
    for item in filter(None, (s.strip() for s in arglist.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(f"bad format rule {text!r}: parameter {item!r} is not key=value")
        if key in params:
            raise ValueError(f"bad format rule {text!r}: parameter {key!r} given twice")
        params[key] = _parse_value(value.strip())
    if name in PASSTHROUGH:
        if params:
            raise ValueError(f"bad format rule {text!r}: {name!r} takes no parameters")
    else:
        try:
            make_format(name, _with_defaults(name, params, defaults or {}))
        except ValueError as e:
            raise ValueError(f"bad format rule {text!r}: {e}") from None
    return FormatRule(glob, name, params)


# --------------------------------------------------------------------------- scanning files


def scan_file(path: str | os.PathLike, fmt: Format, progress: Progress | None = None,
              copy: Any = None) -> RecordIndex:
    """Index one file through a read-only mmap; the stamp is taken before mapping.  ``copy``: a
    compressed file's `compressed.CopyTarget`, where the scan also writes its decoded bytes.

    Raises `StaleSourceError` if the file's size or mtime changed while it was being scanned
    (the index might then describe bytes that no longer exist).  Truncating a file while it is
    mapped can still kill the process with SIGBUS; that is a property of mmap, and why the daemon
    runs this in a worker process (`shufflefs.formats.build`).
    """
    path = os.fspath(path)
    fd = resolve.open_path(path)
    try:
        before = os.fstat(fd)
        size = before.st_size
        mm = None
        if size == 0:
            data = np.zeros(0, dtype=np.uint8)
        else:
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            data = np.frombuffer(mm, dtype=np.uint8)
        try:
            index = fmt.scan(data, path, progress) if copy is None else fmt.scan(data, path, progress, copy=copy)
        finally:
            del data
            if mm is not None:
                try:
                    mm.close()
                except BufferError:  # a view escaped (e.g. in an exception); the GC unmaps it later
                    pass
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if SourceStamp.of(after) != SourceStamp.of(before):
        raise StaleSourceError(path, None, "file changed while it was being indexed")
    if index.size != size and index.cache_kind is None:  # a compressed or Parquet file's is not of its bytes
        raise ValueError(f"{fmt!r} indexed {index.size} bytes of a {size}-byte file")
    return index.stamped(SourceStamp.of(before))


def check_file_index(path: str | os.PathLike, fmt: Format, index: RecordIndex) -> None:
    """`Format.check_index` of ``index`` against the file at ``path`` (headers read with preads)."""
    path = os.fspath(path)
    fd: list[int] = []

    def read(start: int, end: int) -> bytes:
        if not fd:
            fd.append(resolve.open_path(path))
        return os.pread(fd[0], max(end - start, 0), start)

    decoded = None
    if fmt.codec is not None:  # the index is of the decoded bytes
        from .codecs import DecodedReader

        decoded = DecodedReader(index.restarts, read, index.stamp.size, path)
    try:
        fmt.check_index(index, decoded or read, path)
    finally:
        if decoded is not None:
            decoded.close()
        if fd:
            os.close(fd[0])


def load_or_build_index(
    path: str | os.PathLike, fmt: Format, cache: IndexCache, progress: Progress | None = None
) -> RecordIndex:
    """The cached index of ``path`` if its stamp still matches, else a fresh scan (then cached).

    A cache that cannot be written is logged and ignored: it only costs a rescan next time.
    Scans in the calling process; `shufflefs.formats.build.IndexBuilder.build` is the same with the
    scan in a worker process.
    """
    stamp = SourceStamp.of(resolve.stat_path(path))
    key = cache_key(path, stamp, fmt.name, fmt.params())
    cached = cache.load(key, stamp)
    if cached is not None:
        try:
            check_file_index(path, fmt, cached)
            return cached
        except FormatError as e:
            log.warning("cached index of %s dropped: %s", path, e)
            cache.drop(key)
    index = scan_file(path, fmt, progress)
    try:
        cache.store(cache_key(path, index.stamp, fmt.name, fmt.params()), index)
    except OSError as e:
        log.warning("cannot write index cache for %s: %s", path, e)
    return index
