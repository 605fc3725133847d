"""An S3 bucket prefix as a source tree (``shufflefs mount s3://BUCKET/PREFIX MNT``).

Keys under the prefix are the files, ``/`` separates directories.  An object's version is its
ETag (with size and last-modified time; `objects.ObjectInfo.ino`), so a rewritten object is
detected like a rewritten file: indexes are cached by version, and every GET asks for the
version the index describes (``If-Match``), so a changed object answers ESTALE, never bytes of
two versions.  Listings are kept for `LIST_TTL` seconds (``--listing-ttl``) after they arrive, so
that ``ls -l`` and every lookup do not each cost a request; one directory is listed by one thread
at a time (the others wait for its answer), and a listing that took long (100,000 objects: seconds
of pages) is kept `SLOW_LISTING` times as long as it took, so that walking a large prefix does
not list it again and again.

Windows are built from ranged GETs of their runs, many in flight (`objects.ObjectClient`); the
source has no file descriptors (``place`` returns None), so the views copy with the numpy gather
and a node-local stage is written from ``read_runs``.  Needs ``pip install shufflefs[s3]``.
"""

from __future__ import annotations

import logging
import os
import stat as st_mod
import tempfile
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

import numpy as np

from ..errors import ShuffleError, StaleSourceError
from ..formats.base import Format
from ..index.table import RecordIndex, SourceStamp
from .base import Runs, count_requests, index_by_scan
from .objects import ClientOptions, ObjectClient, ObjectInfo
from .packed import PackedCopies, PackedFile

log = logging.getLogger("shufflefs")

LIST_TTL = 2.0
"""Seconds a directory listing answers ``stat`` and ``list`` before it is asked for again."""
SLOW_LISTING = 10.0
"""A listing is kept at least this many times as long as it took to arrive."""
PLAIN_CHUNK = 1 << 20
"""A pass-through file is read in ranged GETs of at least this size (one chunk kept)."""
DIR_MODE = st_mod.S_IFDIR | 0o555
INDEX_DIR = ".shufflefs"
"""A prefix of shufflefs's own under the mounted one (published indexes): never shown as data."""
FILE_MODE = st_mod.S_IFREG | 0o444
PACKED_SUFFIXES = (".gz", ".zst")
"""Objects that are compressed text: downloaded into a copy of their own (`sources.packed`)."""


def parse_url(location: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``; ValueError if malformed."""
    parts = urlsplit(location)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{location}: expected s3://BUCKET[/PREFIX]")
    return parts.netloc, parts.path.strip("/")


def _file_stat(info: ObjectInfo) -> os.stat_result:
    """An object's attributes; its `SourceStamp` (size, time, ETag hash) is its version."""
    return _stat(FILE_MODE, info.size, info.mtime_ns, info.ino)


def _stat(mode: int, size: int, mtime_ns: int, ino: int) -> os.stat_result:
    s = mtime_ns // 10**9
    return os.stat_result((mode, ino, 0, 1, os.getuid(), os.getgid(), size, s, s, s,
                           s, s, s, mtime_ns, mtime_ns, mtime_ns))


class S3Store:
    """The objects under one bucket prefix, read-only."""

    def __init__(self, location: str, endpoint_url: str | None = None, region: str | None = None,
                 in_flight: int = 16, timeout_s: float = 30.0, retries: int = 4, index_url: str | None = None,
                 listing_ttl: float = LIST_TTL) -> None:
        bucket, prefix = parse_url(location)
        self.root = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.prefix = prefix
        self.listing_ttl = listing_ttl
        index_bucket, self.index_prefix = bucket, "/".join(p for p in (prefix, INDEX_DIR, "index") if p)
        if index_url is not None:
            index_bucket, self.index_prefix = parse_url(index_url)
        self.index_location = f"s3://{index_bucket}/{self.index_prefix}".rstrip("/")
        """Where published indexes live (`shufflefs index --publish`): ``PREFIX/.shufflefs/index/``,
        or ``--index-url``."""
        self.indexes = {"published": 0, "published_bytes": 0, "built": 0, "built_bytes": 0}
        """Indexes this mount took from the bucket, and the ones it built by downloading objects."""
        options = ClientOptions(endpoint_url, region, in_flight, timeout_s, retries)
        self.client = ObjectClient(bucket, options)
        self.readahead = self.client.meter
        self.index_client = self.client if index_bucket == bucket else ObjectClient(index_bucket, options)
        self.call_deadline = timeout_s * (retries + 1) + 10.0
        """Seconds a listing or stat may take before its request gets ETIMEDOUT: every retry's
        timeout, and the backoff between them (`serve.workers.Workers`)."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._distrusted: set[str] = set()  # cache keys whose published index was found wrong
        self._listings: dict[str, tuple[float, list[str], dict[str, ObjectInfo]]] = {}  # (expires, ...)
        self._listing_now: dict[str, threading.Event] = {}  # directories being listed right now
        self._started = time.time_ns()
        self._scan_dir = tempfile.gettempdir()  # where `map` downloads (the cache directory once known)
        self.packed = PackedCopies()  # compressed objects' copies, which their views decode
        try:
            found = self.client.first_page(prefix)  # fails now, with the reason, if the bucket cannot be listed
        except ShuffleError as e:
            self.close()
            raise ShuffleError(e.path, None, f"{e.message}; credentials: {self.client.credentials}") from None
        if not found:  # a typo in the prefix would mount as an empty directory
            near = self.client.names_near(prefix) if prefix else []
            self.close()
            beside = f" (beside it: {', '.join(near)})" if near else ""
            what = "this prefix" if prefix else "this bucket"
            raise ShuffleError(self.root, None, f"no object under {what}{beside}: check the URL")

    # ---------------------------------------------------------------- names

    def key(self, relpath: str) -> str:
        return "/".join(p for p in (self.prefix, relpath) if p)

    def path(self, relpath: str) -> str:
        return f"{self.root}/{relpath}" if relpath else self.root

    def _listing(self, relpath: str) -> tuple[list[str], dict[str, ObjectInfo]]:
        while True:
            with self._lock:
                got = self._listings.get(relpath)
                if got is not None and time.monotonic() < got[0]:
                    return got[1], got[2]
                pending = self._listing_now.get(relpath)
                if pending is None:
                    pending = self._listing_now[relpath] = threading.Event()
                    break
            pending.wait(self.call_deadline)  # another thread lists it: take its answer
            with self._lock:
                now = self._listings.get(relpath)
            if now is not None and now is not got:
                return now[1], now[2]
            # that listing failed: list it here (and fail with this thread's own error)
        try:
            began = time.monotonic()
            prefix = self.key(relpath)
            dirs, objects = self.client.list_dir(prefix)
            cut = len(prefix) + 1 if prefix else 0
            subdirs = [d[cut:] for d in dirs if not (relpath == "" and d[cut:] == INDEX_DIR)]  # ours, not data
            files = {o.key[cut:]: o for o in objects if o.key[cut:] and "/" not in o.key[cut:]}
            done = time.monotonic()
            with self._lock:
                self._listings[relpath] = (done + max(self.listing_ttl, SLOW_LISTING * (done - began)), subdirs, files)
            return subdirs, files
        finally:
            with self._lock:
                self._listing_now.pop(relpath, None)
            pending.set()

    def _info(self, relpath: str) -> ObjectInfo | None:
        """The object at ``relpath`` from its directory's listing; None for a directory."""
        parent, _, name = relpath.rpartition("/")
        subdirs, files = self._listing(parent)
        if name in files:
            return files[name]
        if name in subdirs:
            return None
        raise FileNotFoundError(2, "no such object or prefix", self.path(relpath))

    # ---------------------------------------------------------------- Store

    def stat(self, relpath: str, follow_last: bool = False) -> os.stat_result:
        if not relpath:
            return _stat(DIR_MODE, 0, self._started, 1)
        info = self._info(relpath)
        if info is None:
            return _stat(DIR_MODE, 0, self._started, hash(relpath) & (2**62 - 1))
        return _file_stat(info)

    def list(self, relpath: str) -> list[str]:
        subdirs, files = self._listing(relpath)
        return sorted(set(subdirs) | set(files))

    def link_target(self, relpath: str) -> str | None:
        return None  # object stores have no links

    def _current(self, relpath: str, stamp: SourceStamp) -> ObjectInfo:
        """The object as listed (at most ``listing_ttl`` old), which must be version ``stamp``: no
        request of its own, since a change the listing has not seen yet answers the first GET
        (``If-Match``) with ESTALE."""
        try:
            info = self._info(relpath)
        except FileNotFoundError:
            info = None
        if info is None:
            raise StaleSourceError(self.path(relpath), None, "object was removed")
        now = SourceStamp.of(_file_stat(info))
        if now != stamp:
            raise StaleSourceError(self.path(relpath), None, f"object changed since it was indexed (size "
                                   f"{stamp.size} -> {now.size}, ETag now {info.etag})")
        return info

    def open(self, relpath: str, stamp: SourceStamp) -> "ObjectSource":
        return ObjectSource(self, self._current(relpath, stamp))

    def open_file(self, relpath: str) -> "ObjectFile":
        info = self._info(relpath)
        if info is None:
            raise IsADirectoryError(21, "a prefix, not an object", self.path(relpath))
        return ObjectFile(self, info)

    def open_packed(self, relpath: str, stamp: SourceStamp) -> PackedFile:
        """A compressed object at version ``stamp`` as a local file: its copy (`sources.packed`),
        downloaded now if this mount has none of this version."""
        info = self._current(relpath, stamp)
        return self.packed.open(relpath, stamp, self._scan_dir, lambda out: self._fetch_whole(info, out))

    def _fetch_whole(self, info: ObjectInfo, out: np.ndarray) -> None:
        self.client.fetch_runs(info.key, info.etag, np.array([0]), np.array([info.size]), out)
        self._local.scanned = getattr(self._local, "scanned", 0) + info.size

    def map(self, relpath: str, stamp: SourceStamp) -> np.ndarray:
        """The whole object, downloaded in parallel parts into an unlinked file of the cache
        directory (so an object larger than memory is scanned through the page cache); a
        compressed one into its copy (`open_packed`), which its views decode afterwards."""
        info = self._current(relpath, stamp)
        if info.size == 0:
            return np.zeros(0, np.uint8)
        if relpath.endswith(PACKED_SUFFIXES):
            path = self.packed.path_of(relpath, stamp, self._scan_dir, lambda out: self._fetch_whole(info, out))
            return np.memmap(path, np.uint8, "r")  # (a copy replaced meanwhile stays mapped)
        fd, name = tempfile.mkstemp(prefix=".s3-scan-", dir=self._scan_dir)
        try:
            os.unlink(name)
            os.ftruncate(fd, info.size)
            with os.fdopen(os.dup(fd), "r+b") as f:
                data = np.memmap(f, np.uint8, "r+")
            self.client.fetch_runs(info.key, info.etag, np.array([0]), np.array([info.size]), data)
            self._local.scanned = getattr(self._local, "scanned", 0) + info.size
            return data
        finally:
            os.close(fd)

    def index(self, relpath: str, fmt: Format, cache_dir: str | os.PathLike) -> RecordIndex:
        """The object's index: cached here, else published in the bucket for this version (a
        GET of its small index instead of the whole object), else built by downloading it."""
        self._scan_dir = os.fspath(cache_dir)
        got: list[bytes] = []

        def published(key: str) -> bytes | None:
            with self._lock:
                if key in self._distrusted:
                    return None
            data = self.index_client.get_object(self.published_key(key))
            if data is not None:
                got.append(data)
            return data

        self._local.scanned = 0  # bytes `map` downloads for this index (on this thread)
        index = index_by_scan(self, relpath, fmt, cache_dir, published)
        with self._lock:
            if self._local.scanned:
                self.indexes["built"] += 1
                self.indexes["built_bytes"] += self._local.scanned
            elif got:
                self.indexes["published"] += 1
                self.indexes["published_bytes"] += len(got[0])
        return index

    def distrust_published(self, cache_key: str) -> None:
        """A window check found the index of ``cache_key`` wrong: this mount builds it from the
        object from now on, whatever the bucket holds under its name."""
        with self._lock:
            if cache_key not in self._distrusted:
                self._distrusted.add(cache_key)
                log.warning("%s: the index found wrong may be the published one; this mount builds it itself",
                            self.index_client.url(self.published_key(cache_key)))

    def published_key(self, cache_key: str) -> str:
        """The object a published index of cache key ``cache_key`` is kept in: the key names the
        object's URL, version (ETag, size, time) and format, so a rewritten object's index is
        never found for its new version."""
        return "/".join(p for p in (self.index_prefix, f"{cache_key}.npz") if p)

    def publish(self, relpath: str, fmt: Format, cache_dir: str | os.PathLike) -> int:
        """Index an object (or take its cached index) and write it to the bucket for other
        mounts; returns the bytes written."""
        from ..index.table import IndexCache, cache_key

        index = self.index(relpath, fmt, cache_dir)
        key = cache_key(self.path(relpath), index.stamp, fmt.name, fmt.params())
        data = IndexCache(cache_dir).entry_bytes(key)
        if data is None:
            raise OSError(f"{self.path(relpath)}: its index was not cached in {cache_dir}")
        self.index_client.put(self.published_key(key), data)
        return len(data)

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs_result((4096, 4096, 0, 0, 0, 0, 0, 0, 0, 1024))

    def requests(self) -> dict[str, int]:
        """Counters of every request this mount made (`shufflefs stat`)."""
        clients = {id(c): c for c in (self.client, self.index_client)}.values()
        with self._lock:
            indexes = {f"index_{k}": v for k, v in self.indexes.items()}
        latency, part, rate = self.readahead.estimate(time.monotonic())
        link = {"link_latency_ms": latency * 1e3, "link_part_ms": part * 1e3, "link_rate": rate,
                "link_ahead": self.readahead.in_flight(time.monotonic()), "link_ahead_cap": self.readahead.cap}
        packed = self.packed.describe()
        return {"requests": sum(c.requests for c in clients), "bytes": sum(c.bytes for c in clients),
                "failed": sum(c.failures for c in clients), **indexes,
                "packed_copies": packed["copies"], "packed_bytes": packed["bytes"],
                **{k: v for k, v in link.items() if v == v}}  # NaN (unmeasured) left out

    def close(self) -> None:
        self.client.close()
        if self.index_client is not self.client:
            self.index_client.close()
        self.packed.close()


class ObjectSource:
    """One version of an object, as a view's `Source`: every GET is pinned to its ETag."""

    local_fd = -1

    def __init__(self, store: S3Store, info: ObjectInfo) -> None:
        self.store, self.info = store, info
        self.url = store.client.url(info.key)
        self.stale: StaleSourceError | None = None

    def _guard(self, fn, *args):  # noqa: ANN001, ANN202 -- remembers that the object changed
        if self.stale is not None:
            raise self.stale
        try:
            return fn(*args)
        except StaleSourceError as e:
            self.stale = e
            raise

    def check(self) -> None:
        if self.stale is not None:
            raise self.stale

    def verify_open(self) -> None:
        if self.stale is not None:
            raise self.stale

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs | None:
        return None  # no descriptors: windows come from `read_runs`

    def file_of(self, fd: int) -> "ObjectSource":
        return self

    def read_range(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        count_requests(1, end - start)
        return self._guard(self.store.client.get, self.info.key, self.info.etag, start, end).tobytes()

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        total = int((np.asarray(ends) - np.asarray(starts)).sum())
        buf = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
        self.begin_runs(starts, ends, buf)()
        return buf

    def begin_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray) -> Callable[[], None]:
        """`read_runs` into ``out`` (exactly the runs' bytes) started; the returned call waits
        (`pool.PoolSource` starts every member's runs before it waits for any)."""
        if self.stale is not None:
            raise self.stale
        if len(out) == 0:
            return lambda: None
        finish = self.store.client.begin_runs(self.info.key, self.info.etag, starts, ends, out)
        return lambda: self._guard(finish)

    def advise(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> None:
        """Nothing: the window cache already loads the next window while this one is read."""

    def ended(self, offset: int) -> None:
        raise StaleSourceError(self.url, offset, "object ended early")

    def verify_read(self, offset: int | None) -> None:
        self.check()

    def close(self) -> None:
        pass


class ObjectFile:
    """A pass-through object (not a data file): the version seen at open, read by ranges."""

    def __init__(self, store: S3Store, info: ObjectInfo) -> None:
        self.source = ObjectSource(store, info)
        self._chunk: tuple[int, bytes] = (0, b"")

    def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.source.info.size - offset))
        if size == 0:
            return b""
        at, chunk = self._chunk
        if not (at <= offset and offset + size <= at + len(chunk)):
            end = min(self.source.info.size, offset + max(size, PLAIN_CHUNK))
            at, chunk = offset, self.source.read_range(offset, end)
            self._chunk = (at, chunk)
        return chunk[offset - at: offset - at + size]

    def close(self) -> None:
        self._chunk = (0, b"")
