"""The offset table of one source file, and its on-disk cache.

Every supported format lays a file out as ``header | record 0 | record 1 | ... | trailer`` with
records tiling the middle, so one int64 array of n+1 boundaries locates every record (8 bytes per
record; lengths are its differences).  The cache lives outside the source tree and is keyed by
path, size, mtime and the format parameters, so a changed file or a changed option rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

INDEX_VERSION = 1


@dataclass(frozen=True)
class SourceStamp:
    """What identifies the bytes an index was built from; compared on every window load."""

    size: int
    mtime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> "SourceStamp":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass(frozen=True, eq=False)
class RecordIndex:
    """Record i occupies source bytes ``[bounds[i], bounds[i+1])``.

    ``bounds[0]`` is the end of the header (kept first in every view) and ``bounds[-1]`` the
    start of the trailer (kept last).  ``add_newline`` marks a text file whose last line lacks
    its newline: the view appends one to that record so records stay separate.
    """

    size: int
    bounds: np.ndarray
    add_newline: bool = False
    stamp: SourceStamp | None = None
    _lengths: list = field(default_factory=list, repr=False, compare=False)

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

    @property
    def header_end(self) -> int:
        return int(self.bounds[0])

    @property
    def trailer_start(self) -> int:
        return int(self.bounds[-1])

    @property
    def data_bytes(self) -> int:
        """Bytes of records in the view (with the added newline, if any)."""
        return self.trailer_start - self.header_end + int(self.add_newline)

    @property
    def view_size(self) -> int:
        return self.size + int(self.add_newline)

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

    def out_lengths(self, ids: np.ndarray) -> np.ndarray:
        """Length in the view of records ``ids`` (the last record may gain a newline)."""
        out = self.record_lengths(ids)
        if self.add_newline:
            out = out + (ids == self.n - 1)
        return out


# --------------------------------------------------------------------------- on-disk cache


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shufflefs"


def cache_key(path: str | os.PathLike, stamp: SourceStamp, fmt_name: str, fmt_params: dict) -> str:
    ident = json.dumps(
        {
            "v": INDEX_VERSION,
            "path": os.path.realpath(path),
            "size": stamp.size,
            "mtime_ns": stamp.mtime_ns,
            "ino": stamp.ino,
            "format": fmt_name,
            "params": fmt_params,
        },
        sort_keys=True,
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


class IndexCache:
    """Index files named by `cache_key`; a stale entry simply has another key and is never read."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.dir = Path(directory) if directory is not None else default_cache_dir()

    def _file(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.npz"

    def load(self, key: str, stamp: SourceStamp) -> RecordIndex | None:
        f = self._file(key)
        try:
            with np.load(f, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                bounds = z["bounds"].astype(np.int64, copy=False)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            return None  # missing, empty or damaged: rebuilt and rewritten by the caller
        if meta.get("v") != INDEX_VERSION or meta.get("size") != stamp.size:
            return None
        return RecordIndex(stamp.size, bounds, bool(meta["add_newline"]), stamp)

    def store(self, key: str, index: RecordIndex) -> None:
        """Write atomically (temp file + rename) so a crash never leaves a half index."""
        f = self._file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        meta = json.dumps({"v": INDEX_VERSION, "size": index.size, "add_newline": index.add_newline})
        fd, tmp = tempfile.mkstemp(dir=f.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                np.savez(out, bounds=index.bounds, meta=np.frombuffer(meta.encode(), dtype=np.uint8))
                out.flush()
                os.fsync(out.fileno())  # a crash must leave the old entry or the whole new one
            os.replace(tmp, f)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
