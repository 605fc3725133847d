"""The offset table of one source file, and its on-disk cache.

Every supported format lays a file out as ``header | record 0 | record 1 | ... | trailer`` with
records tiling the middle, so one int64 array of n+1 boundaries locates every record (8 bytes per
record; lengths are its differences).  The cache lives outside the source tree and is keyed by
path, size, mtime, ctime, inode and the format parameters, so a changed file or a changed option rebuilds it.
A cache entry is a hint, never the truth: it carries a checksum of itself and the version it was
built for, both checked on load, and the formats check its bounds against the file (on load, and
as every window is gathered; see `formats.base.Format.frame_check`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, ClassVar

import numpy as np

INDEX_VERSION = 3


@dataclass(frozen=True)
class SourceStamp:
    """What identifies the bytes an index was built from; compared on every read and window load.

    Size and mtime alone miss a rewrite in place that keeps the size and sets the mtime back
    (``touch -d``); the ctime cannot be set back by a user, and every write, truncate, chmod or
    rename moves it, so a file whose ctime moved is treated as changed (at worst a needless
    ``ESTALE`` for a chmod, never bytes of two versions)."""

    size: int
    mtime_ns: int
    ino: int
    ctime_ns: int = 0

    @classmethod
    def of(cls, st: os.stat_result) -> "SourceStamp":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)

    def matches(self, st: os.stat_result) -> bool:
        """Whether ``st`` still describes these bytes (the per-read check: no allocation)."""
        return (st.st_size == self.size and st.st_mtime_ns == self.mtime_ns and st.st_ino == self.ino
                and st.st_ctime_ns == self.ctime_ns)


@dataclass(frozen=True, eq=False)
class RecordIndex:
    """Record i occupies source bytes ``[bounds[i], bounds[i+1])``.

    ``bounds[0]`` is the end of the header (kept first in every view) and ``bounds[-1]`` the
    start of the trailer (kept last).  ``add_newline`` marks a text file whose last line lacks
    its newline (a line being written, or a file saved without one): that record is *torn*, and
    views keep it out of the shuffle and place it last, unchanged (`torn`, `body`).
    """

    size: int
    bounds: np.ndarray
    add_newline: bool = False
    stamp: SourceStamp | None = None
    _lengths: list = field(default_factory=list, repr=False, compare=False)
    block_floor: ClassVar[int] = 0
    """The smallest block its source reads at near full speed, for automatic block sizes: 0 for
    a file read in place; a compressed file's multiple of its restart spacing (`decoded`)."""
    cache_kind: ClassVar[str | None] = None
    """A subclass whose cache entries keep more than the bounds (`decoded.DecodedIndex`)."""

    def __post_init__(self) -> None:
        b = self.bounds
        if b.dtype != np.int64 or b.ndim != 1 or len(b) < 1:
            raise ValueError("bounds must be a 1-d int64 array with at least one element")
        if b[0] < 0 or b[-1] > self.size:
            raise ValueError("bounds outside the file")
        if self.add_newline and len(b) < 2:
            raise ValueError("add_newline needs at least one record")

    @property
    def n(self) -> int:
        return len(self.bounds) - 1

    def stamped(self, stamp: SourceStamp) -> "RecordIndex":
        """This index of the file's version ``stamp`` (a scan's result, stamped by its caller)."""
        return RecordIndex(self.size, self.bounds, self.add_newline, stamp)

    @property
    def header_end(self) -> int:
        return int(self.bounds[0])

    @property
    def trailer_start(self) -> int:
        return int(self.bounds[-1])

    @property
    def data_bytes(self) -> int:
        """Bytes of records in the view (with the newlines it adds, `newline_ids`)."""
        return self.trailer_start - self.header_end + len(self.newline_ids)

    @property
    def view_size(self) -> int:
        return self.size + len(self.newline_ids)

    @property
    def torn(self) -> int:
        """How many records at the end of the ids are lines without their newline (ids
        ``[n - torn, n)``): plans shuffle the others (`body`) and give these last, in id order,
        at the end of the epoch's stream (`strategies.torn`)."""
        return int(self.add_newline)

    @property
    def unterminated_ids(self) -> np.ndarray:
        """Every record that is a line without its newline (sorted int64); for a file, its last
        if ``add_newline``.  Only indexes whose such records are their last ids can be planned."""
        return np.full(1, self.n - 1, np.int64) if self.add_newline else np.zeros(0, np.int64)

    def body(self) -> "RecordIndex":
        """The index of records ``[0, n - torn)`` (the ones a strategy shuffles), itself if none
        is torn: the same ids, and the torn line left in the trailer."""
        if not self.add_newline:
            return self
        return RecordIndex(self.size, self.bounds[:-1], False, self.stamp)

    def torn_last(self) -> "RecordIndex":
        """The index whose views are planned: one with its unterminated records last (a file's
        is already; a pool's moves its members' to the end, `index.joined_index`)."""
        return self

    @property
    def starts(self) -> np.ndarray:
        return self.bounds[:-1]

    @property
    def lengths(self) -> np.ndarray:
        """Source length of every record (int64, computed once and kept: 8 more bytes per
        record, so the daemon never asks for it; it uses `record_lengths`)."""
        if not self._lengths:
            self._lengths.append(np.diff(self.bounds))
        return self._lengths[0]

    def record_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Source length of records ``ids`` (int64), from the bounds alone: O(len(ids))."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._lengths:
            return self._lengths[0][ids]
        return self.bounds[ids + 1] - self.bounds[ids]

    @property
    def newline_ids(self) -> np.ndarray:
        """Records that gain a newline in the view (sorted int64): none for a file, whose torn
        last line ends its stream as it ends the file; for several torn records (a pool's), every
        one but the last, so they stay separate lines."""
        return np.zeros(0, np.int64)

    def out_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Length in the view of records ``ids`` (a record in `newline_ids` gains a newline)."""
        out = self.record_lengths(ids)
        nl = self.newline_ids
        if len(nl):
            pos = np.minimum(np.searchsorted(nl, ids), len(nl) - 1)
            out = out + (nl[pos] == ids)
        return out

    def unit_firsts(self, unit_size: int) -> np.ndarray:
        """First record id of every non-empty unit of ``unit_size`` bytes, then n (int64[units+1]);
        see `unit_firsts`."""
        return unit_firsts(self.bounds, unit_size)

    def unit_bytes(self, firsts: np.ndarray) -> np.ndarray:
        """View bytes of each unit ``[firsts[u], firsts[u+1])`` (newlines the view adds included)."""
        b = self.bounds
        out = b[firsts[1:]] - b[firsts[:-1]]
        nl = self.newline_ids
        if len(nl) and len(out):
            out += np.diff(np.searchsorted(nl, firsts, side="left"))
        return out


def unit_firsts(bounds: np.ndarray, unit_size: int) -> np.ndarray:
    """First record id of every non-empty unit of ``unit_size`` bytes, then n (int64[units+1]).

    Unit u is the absolute source range ``[u*unit_size, (u+1)*unit_size)`` and owns the records
    whose first byte lies in it; units owning no record (inside a large record) are dropped.
    Costs O(min(spanned units, n)) with a searchsorted per unit boundary, never a Python loop.
    """
    I64 = np.int64
    starts = bounds[:-1]
    n = len(starts)
    if n == 0:
        return np.zeros(1, I64)
    u0, u1 = int(starts[0]) // unit_size, int(starts[-1]) // unit_size
    if u1 - u0 + 1 <= n:
        edges = np.arange(u0 + 1, u1 + 1, dtype=I64) * unit_size
        inner = np.searchsorted(starts, edges, side="left").astype(I64)
    else:
        # units far smaller than records: most units are empty, so look at the records instead
        owner = starts // unit_size
        inner = np.flatnonzero(owner[1:] != owner[:-1]).astype(I64) + 1
    firsts = np.concatenate((np.zeros(1, I64), inner, np.full(1, n, I64)))
    keep = np.concatenate((firsts[1:] != firsts[:-1], [True]))
    return firsts[keep]


# --------------------------------------------------------------------------- on-disk cache


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shufflefs"


def cache_key(path: str | os.PathLike, stamp: SourceStamp, fmt_name: str, fmt_params: dict) -> str:
    ident = json.dumps(
        {
            "v": INDEX_VERSION,
            "path": str(path) if "://" in str(path) else os.path.realpath(path),  # a URL names itself
            "size": stamp.size,
            "mtime_ns": stamp.mtime_ns,
            "ino": stamp.ino,
            "ctime_ns": stamp.ctime_ns,
            "format": fmt_name,
            "params": fmt_params,
        },
        sort_keys=True,
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _digest(bounds: np.ndarray, meta: dict, extra: dict[str, np.ndarray] | None = None) -> str:
    """Checksum of an entry's content: its bounds' bytes, its other fields and arrays."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(meta, sort_keys=True).encode())
    h.update(np.ascontiguousarray(bounds, "<i8").tobytes())
    for name in sorted(extra or ()):
        h.update(name.encode() + np.ascontiguousarray(extra[name]).tobytes())
    return h.hexdigest()


INDEX_KINDS = {"decoded": ("shufflefs.index.decoded", "DecodedIndex"),
               "parquet": ("shufflefs.formats.parquet.index", "ParquetIndex")}
"""Cache entries of subclasses (``cache_kind``): where the class is that reads them back."""


def _kind(name: str) -> type:
    import importlib

    module, cls = INDEX_KINDS[name]
    return getattr(importlib.import_module(module), cls)


def _stamp_fields(stamp: SourceStamp | None) -> dict | None:
    return None if stamp is None else {"size": stamp.size, "mtime_ns": stamp.mtime_ns, "ino": stamp.ino,
                                       "ctime_ns": stamp.ctime_ns}


class IndexCache:
    """Index files named by `cache_key`; a stale entry simply has another key and is never read.

    An entry is trusted only if it is whole (its checksum), was built for the version asked for
    (its stamp, not only its name) and its bounds could be an index of that file (ascending,
    inside it).  Whether they fall where the file's records begin is the formats' to check:
    `drop` removes an entry they found wrong."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.dir = Path(directory) if directory is not None else default_cache_dir()

    def _file(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.npz"

    def load(self, key: str, stamp: SourceStamp) -> RecordIndex | None:
        """The entry ``key`` if it is whole and built for ``stamp``; None otherwise (missing,
        damaged or of another version: the caller rebuilds and rewrites it)."""
        f = self._file(key)
        try:
            with np.load(f, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                bounds = z["bounds"]
                extra = {name: z[name] for name in meta.get("extra", ())} if isinstance(meta, dict) else {}
            if not isinstance(meta, dict) or bounds.dtype != np.dtype("<i8") or bounds.ndim != 1:
                return None
            digest = meta.pop("sum", None)
            if meta.get("v") != INDEX_VERSION or digest != _digest(bounds, meta, extra):
                return None
            kind = meta.get("kind")  # a decoded file's size is its decoded bytes', not the file's
            if meta.get("stamp") != _stamp_fields(stamp) or (kind is None and meta.get("size") != stamp.size):
                return None
            if len(bounds) > 1 and not (bounds[1:] > bounds[:-1]).all():
                return None  # every format's records hold at least one byte
            size = stamp.size if kind is None else int(meta["size"])
            index = RecordIndex(size, bounds.astype(np.int64, copy=False), bool(meta["add_newline"]), stamp)
            return index if kind is None else _kind(kind).from_cache(index, extra)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
            return None  # missing, empty or damaged: rebuilt and rewritten by the caller

    def entry_bytes(self, key: str) -> bytes | None:
        """Entry ``key``'s file as it is (to publish it), or None if there is none."""
        try:
            return self._file(key).read_bytes()
        except OSError:
            return None

    def put_entry(self, key: str, data: bytes) -> None:
        """Write an entry's file as another machine published it; `load` then checks it."""
        f = self._file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(f, lambda out: out.write(data), prefix=f"{os.getpid()}-")

    def drop(self, key: str) -> bool:
        """Remove entry ``key`` (found wrong for its file); False if there was none."""
        try:
            os.unlink(self._file(key))
            return True
        except FileNotFoundError:
            return False

    def store(self, key: str, index: RecordIndex) -> None:
        """Write atomically (temp file + rename) so a crash never leaves a half index."""
        f = self._file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        fields = {"v": INDEX_VERSION, "size": index.size, "add_newline": index.add_newline,
                  "stamp": _stamp_fields(index.stamp)}
        extra = index.cache_arrays() if index.cache_kind is not None else {}
        if extra:
            fields.update(kind=index.cache_kind, extra=sorted(extra))
        bounds = np.ascontiguousarray(index.bounds, "<i8")
        meta = json.dumps({**fields, "sum": _digest(bounds, fields, extra)})
        write_atomically(f, lambda out: np.savez(out, bounds=bounds, meta=np.frombuffer(meta.encode(), dtype=np.uint8),
                                                 **extra), prefix=f"{os.getpid()}-")  # see scratch.py


def write_atomically(path: Path, write: Callable[[BinaryIO], object], prefix: str, mode: int | None = None,
                     sync: bool = True) -> None:
    """Write ``path`` through a temporary file beside it (opened for reading too, so ``write`` may
    map it), flushed and renamed over it, so that a crash or an error in ``write`` leaves the old
    file or the whole new one, never a part.  ``sync``: flushed to disk first (a node-local copy
    removed at unmount needs no fsync)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w+b") as out:
            write(out)
            out.flush()
            if sync:
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
