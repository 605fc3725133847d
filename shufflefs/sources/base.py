"""The seam between shufflefs and where the bytes live: a `Store` (a tree of source files) and a
`Source` (one open version of a file, or of a pool of files).

The catalog asks a store to list, stat and open; a view asks its source for runs of bytes.
Local files implement both (`local`), a pool's members share one `pool.PoolSource`, and a
node-local stage (`stages.stage_file.StagedSource`) sits in front of either.  A new kind of storage is one
module that implements `Store` and `Source`, plus one line in `sources.STORES`.

A source whose bytes are reachable through file descriptors (``place`` returns `Runs`) is read
by the compiled gather without the GIL; any other source returns None from ``place`` and its
windows are assembled from ``read_runs`` (one call per window with every run in ascending order,
so a remote source can fetch them concurrently).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np
import trio
from numpy.lib.stride_tricks import as_strided

from ..formats.base import Format
from ..index.table import RecordIndex, SourceStamp

try:
    from .. import _gather  # compiled at install time; optional
except ImportError:  # pragma: no cover - depends on the build
    _gather = None

log = logging.getLogger("shufflefs")


_requests = threading.local()
_closer = ThreadPoolExecutor(4, thread_name_prefix="shufflefs-close")


def open_checks_of(sources: Any) -> list[tuple[int, int, int, int, int]] | None:
    """Every source's ``open_checks`` one after the other (what a view over all of them is
    checked by before a compiled reply), or None if one has none."""
    out: list[tuple[int, int, int, int, int]] = []
    for source in sources:
        ask = getattr(source, "open_checks", None)
        got = ask() if ask is not None else None
        if got is None:
            return None
        out += got
    return out


def close_fd(fd: int) -> None:
    """Close a source descriptor; from the event loop's thread, on a closing thread instead.

    Closing a file can wait on its filesystem (FUSE sends a flush, a network filesystem may
    write back), and a hung source would then stop the loop that answers every request: the
    loop only ever hands the descriptor over."""
    try:
        in_loop = trio.lowlevel.in_trio_run()
    except RuntimeError:  # pragma: no cover - a worker thread of a run
        in_loop = False
    if in_loop:
        _closer.submit(_close_quietly, fd)
    else:
        os.close(fd)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class Fetched(NamedTuple):
    """Requests a remote source made, and the bytes they returned (gaps between coalesced runs
    included)."""

    requests: int = 0
    nbytes: int = 0


def count_requests(n: int, nbytes: int) -> None:
    """A remote source made ``n`` requests returning ``nbytes`` for the work of this thread (a
    window load, a stage chunk)."""
    got = getattr(_requests, "got", Fetched())
    _requests.got = Fetched(got.requests + n, got.nbytes + nbytes)


def finish_all(waits: list[Callable[[], None]]) -> None:
    """Wait for every read in flight, then raise the first error: none may still write into a
    caller's buffer after a raise."""
    error: BaseException | None = None
    for finish in waits:
        try:
            finish()
        except BaseException as e:  # noqa: BLE001 -- the first is raised below
            error = error or e
    if error is not None:
        raise error


def take_requests() -> Fetched:
    """What was counted on this thread since the last call (nothing for local sources)."""
    got = getattr(_requests, "got", Fetched())
    _requests.got = Fetched()
    return got


class Runs(NamedTuple):
    """Ascending runs of consecutive record ids and where each lies: records ``[first,
    first+count)`` are in the file open as ``fd``, record x at file offset ``bounds[x] + shift``.
    The form `_gather.build_window` reads (int64 arrays, one entry per run)."""

    first: np.ndarray
    count: np.ndarray
    fd: np.ndarray
    shift: np.ndarray

    def nbytes(self, bounds: np.ndarray) -> np.ndarray:
        return bounds[self.first + self.count] - bounds[self.first]


class Members(NamedTuple):
    """A source's files as read-only mappings, for copying records in view order
    (`_gather.gather_mapped`): record x lies in member m, the last whose ``first[m] <= x``, at
    offset ``bounds[x] + shift[m]`` of ``maps[slot[m]]`` (slot -1: an empty member, never read);
    ``fd[m]`` names the member's file for `Source.file_of`."""

    maps: tuple
    first: np.ndarray
    slot: np.ndarray
    shift: np.ndarray
    fd: np.ndarray


class Reader(Protocol):
    """A file a run can lie in (a source file, or a stage file): reports its own failures."""

    def ended(self, offset: int) -> None: ...

    def verify_read(self, offset: int | None) -> None: ...

    # optional: ``mapping() -> buffer | None``, a read-only mapping of the file, from which a
    # pool's `Source.mapped_members` is made
    # optional on a `Source`: ``mapped_members() -> Members | None``, all of its files mapped, for
    # record-level windows copied in view order (`view.MAP_RUN`); a source without it is read by runs


class Source(Protocol):
    """One version of a source file (or of a pool's files) that a view reads records from.

    Every method raises `errors.StaleSourceError` (never returns bytes) once the source no longer
    matches the stamp it was opened with."""

    local_fd: int
    """The descriptor of runs that count as local bytes (a stage), or -1."""

    def check(self) -> None:
        """Before a window load: the source still names the same, unchanged bytes."""

    def verify_open(self) -> None:
        """Before every read is served: a cheap check that the open source is unchanged."""

    # optional: ``open_checks() -> list[(fd, ino, size, mtime_ns, ctime_ns)] | None``, what
    # `verify_open` checks when it is only ``fstat`` of open files: the compiled replies
    # (`serve.replies`) repeat it before each reply; a source without it is answered by Python

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs | None:
        """Where runs of record ids lie (descriptors and shifts for the compiled gather), or None
        if the source has no descriptors (its windows are then built from `read_runs`)."""

    def file_of(self, fd: int) -> Reader:
        """The file behind a descriptor ``place`` returned."""

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (headers and trailers)."""

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The ranges (ascending) concatenated, into ``out`` when it is large enough."""

    def advise(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> None:
        """A hint that these runs are read soon (returns at once; may do nothing)."""

    def close(self) -> None: ...


class PlainFile(Protocol):
    """A file served unchanged (no format): its bytes as they are now."""

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset``: fewer only at the end of the file."""

    def close(self) -> None: ...


class Store(Protocol):
    """A read-only tree of source files; paths are relative to its root ("" is the root).

    All methods block (the catalog calls them on worker threads) and raise OSError with the
    errno a reader should see (``FileNotFoundError`` for a name that is gone)."""

    root: str
    """What the mount shows (logs, ``shufflefs stat``)."""

    readahead: Any
    """None for a local tree; a remote store's `link.LinkMeter`: the bytes its windows should
    keep loading ahead of a sequential reader (`windows.cache.Readahead`)."""

    def path(self, relpath: str) -> str:
        """The name of a file in logs and errors (for local files, the path itself)."""

    def stat(self, relpath: str, follow_last: bool = False) -> os.stat_result:
        """Attributes of an entry: a directory, a regular file or a symbolic link.  The mount
        shows mode, size, owner, times (``st_*_ns``); ``st_ino`` and ``st_ctime_ns`` are part of a
        file's version (`index.SourceStamp`); block counts may be missing."""

    def list(self, relpath: str) -> list[str]:
        """The names in a directory."""

    def link_target(self, relpath: str) -> str | None:
        """A link's target as shown in the mount, or None if it leads out of the tree."""

    def open(self, relpath: str, stamp: SourceStamp) -> Source:
        """The file's version ``stamp``; `errors.StaleSourceError` if it is not that version now."""

    def open_file(self, relpath: str) -> PlainFile:
        """The file as it is, for pass-through reads."""

    def map(self, relpath: str, stamp: SourceStamp) -> np.ndarray:
        """The whole file as read-only bytes (scanned once for record costs)."""

    def index(self, relpath: str, fmt: Format, cache_dir: str | os.PathLike) -> RecordIndex:
        """The file's record index (cached in ``cache_dir`` by version)."""

    def statvfs(self) -> os.statvfs_result: ...

    def close(self) -> None:
        """The mount ended (nothing is read through the store after this)."""


def index_by_scan(store: Store, relpath: str, fmt: Format, cache_dir: str | os.PathLike,
                  published: Callable[[str], bytes | None] | None = None) -> RecordIndex:
    """`Store.index` for a store with no faster way: the file's bytes (``map``) scanned in this
    process, the index cached by version like a local file's.  ``published(key)``: the bytes of a
    cache entry published for cache key ``key`` (None: there is none), tried before scanning; an
    entry that is damaged or of another version is dropped and the file scanned."""
    from ..errors import StaleSourceError
    from ..index.table import IndexCache, cache_key

    path = store.path(relpath)
    stamp = SourceStamp.of(store.stat(relpath, follow_last=True))
    cache = IndexCache(cache_dir)
    key = cache_key(path, stamp, fmt.name, fmt.params())
    cached = cache.load(key, stamp)
    if cached is not None:
        return cached
    data = published(key) if published is not None else None
    if data is not None:
        try:
            cache.put_entry(key, data)
        except OSError:
            pass
        cached = cache.load(key, stamp)
        if cached is not None:
            return cached
        cache.drop(key)
        log.warning("%s: its published index is damaged or of another version: indexing it here", path)
    scanned = fmt.scan(store.map(relpath, stamp), path)
    if getattr(scanned, "cache_kind", None) is not None:  # rows (Parquet), decoded bytes (compressed)
        index = scanned.stamped(stamp)
    elif scanned.size != stamp.size:
        raise StaleSourceError(path, None, f"read {scanned.size} bytes of a {stamp.size}-byte file")
    else:
        index = RecordIndex(scanned.size, scanned.bounds, scanned.add_newline, stamp)
    try:
        cache.store(key, index)
    except OSError:
        pass  # only costs a scan next time
    return index


def gather(src: np.ndarray, src_pos: np.ndarray, lengths: np.ndarray, out: np.ndarray, out_pos: np.ndarray,
           compiled: bool = True) -> None:
    """``out[out_pos[i]:+lengths[i]] = src[src_pos[i]:+lengths[i]]`` for all i."""
    n = len(lengths)
    if n == 0:
        return
    L = int(lengths[0])
    if (L > 0 and len(src) == n * L and np.all(lengths == L) and not np.any(src_pos % L)
            and np.array_equal(out_pos, np.arange(0, n * L, L))):
        # fixed-size records packed on both sides: one row gather (fixed / npy / equal lines)
        np.take(src.reshape(n, L), src_pos // L, axis=0, out=out[: n * L].reshape(n, L))
        return
    if compiled and _gather is not None:
        i64 = np.ascontiguousarray
        _gather.gather(out, src, i64(out_pos, np.int64), i64(src_pos, np.int64), i64(lengths, np.int64))
        return
    # variable lengths: one vectorised row copy per distinct length.  Each byte range of length L
    # is a row of an overlapping (stride 1) 2-d view of the buffer, so records of equal length
    # move together by fancy indexing; the Python loop runs over lengths, not records.
    order = np.argsort(lengths, kind="stable")
    sorted_len = lengths[order]
    edges = np.flatnonzero(np.diff(sorted_len)) + 1
    for grp in np.split(order, edges):
        L = int(lengths[grp[0]])
        if L == 0:
            continue
        src_rows = as_strided(src, shape=(len(src) - L + 1, L), strides=(1, 1), writeable=False)
        out_rows = as_strided(out, shape=(len(out) - L + 1, L), strides=(1, 1))
        out_rows[out_pos[grp]] = src_rows[src_pos[grp]]
