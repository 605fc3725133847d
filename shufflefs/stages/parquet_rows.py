"""Decoded copies of Parquet files on node-local disk, from which their views are encoded.

A view's row group takes rows from anywhere in its file, and pyarrow decodes whole source row
groups, so each file version is decoded once into a copy of its rows as row streams
(`formats.parquet.streams`): one file per version, sized from the index when the first view of
that version opens (sparse until filled), filled one source row group at a time, each decoded
column by column (memory: one column chunk), when a window first needs it, then read through a
read-only mapping by every view of that version, every epoch.  Copies go under ``--stage-dir``,
else the cache directory (node-local disk, where indexes are), in a directory of their own held
like a stage directory (`scratch.held`: a killed mount's is removed by the next one there), and
are removed when no view reads them and a newer version replaced them.  At unmount a whole copy
of a local file is kept for the next mount there (`kept_copies`, as compressed files' copies are:
a rename, taken back by a mount that opens the same version, and given up for room first; a
pool's copy by the versions of all its members), the others removed; a stage built while such a
copy is on disk only reads its largest column around the page cache (`parquet_scatter`).  A local file is read by
pyarrow's own preads; an object (no descriptor) by ranged GETs of whole row groups
(`parquet_fetch`).  Blocking (worker threads), no FUSE.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import shutil
import threading
import time
from typing import Any, Callable

import numpy as np

from .. import scratch
from ..errors import FormatError, StaleSourceError, StageError
from ..formats.parquet.decode import decode_top_batches
from ..formats.parquet.footer import SourceFooter, read_footer
from ..formats.parquet.index import ParquetIndex
from ..formats.parquet.streams import RowStreams, StreamLayout, group_pieces
from ..index.table import SourceStamp
from ..sources.base import Source
from .kept_copies import CopyDisk
from .parquet_fetch import Fetched, RangedReader, group_bytes

log = logging.getLogger("shufflefs")

COPY_PREFIX = "parquet-"
DECODE_FACTOR = 3
"""A batch of a column chunk being copied takes about this many times its stream bytes in memory
(pyarrow's arrays, the levels and values taken from them, the stream written)."""
BATCH_BYTES = 8 << 20
"""About the stream bytes of a batch of rows decoded at a time while a column chunk is copied:
pyarrow holds the chunk as stored and one batch decoded, where a whole chunk decoded took three
times its bytes besides (measured on a 1 GiB file of 62 MB text chunks: the daemon's own memory
peaked at 365 MiB while its copy was filled, 243 MiB after)."""


class RowCopy:
    """One file version's rows on local disk (`streams`), filled as windows need them; or,
    ``taken``, the whole copy an earlier mount kept, already at ``file``."""

    def __init__(self, path: str, index: ParquetIndex, file: str, taken: bool = False,
                 layout: StreamLayout | None = None) -> None:
        self.path, self.index, self.file = path, index, file
        self.layout = layout if layout is not None else StreamLayout(index.footer, index.sizes)
        self.present = np.full(len(index.footer.group_rows), taken, bool)
        self.users = 0
        self.seconds = 0.0
        self.remote = False
        """Whether the copy is filled from object storage (by whole row groups, `parquet_fetch`)."""
        self.made = "by an earlier mount" if taken else "by this mount"
        self.fetched = Fetched()
        self.stop = threading.Event()  # the mount's (`RowCopies.stop`): a fill ends at its next batch
        self._complete = taken or not len(self.present)
        self._fill = threading.Lock()
        self._fd = os.open(file, os.O_RDWR | os.O_CLOEXEC | (0 if taken else os.O_CREAT | os.O_EXCL), 0o600)
        try:
            if os.fstat(self._fd).st_size != self.layout.size:
                os.ftruncate(self._fd, self.layout.size)  # sparse until filled
            self._map = mmap.mmap(self._fd, self.layout.size, prot=mmap.PROT_READ) if self.layout.size else None
        except BaseException:
            os.close(self._fd)
            os.unlink(file)
            raise
        self._ahead = taken
        """Whether to read the copy in ahead at its first gather (`warm`): taken, it is likely on disk only."""
        self._direct: bool | None = None
        data = np.frombuffer(self._map, np.uint8) if self._map is not None else np.zeros(0, np.uint8)
        self.streams = RowStreams(self.layout, data)

    def warm(self) -> None:
        """Read a taken copy in ahead, once, before rows are gathered from it: not page by page as
        windows gather rows.  A stage that reads the copy around the page cache does not ask
        (`parquet_scatter`)."""
        if self._ahead:
            self._ahead = False
            try:
                scratch.read_ahead_in_thread(self._fd, self.layout.size, "copy-ahead", mapping=self._map)
            except OSError:
                pass  # a hint only

    def read_ahead(self, ranges: list[tuple[int, int]]) -> None:
        """Ask for bytes ``[lo, hi)`` of the copy of each range into the page cache, in a thread."""
        try:
            scratch.read_ranges_ahead_in_thread(self._fd, ranges, "copy-ahead")
        except OSError:
            pass  # a hint only

    def cached_share(self, start: int, end: int) -> float:
        """The share of the copy's bytes ``[start, end)`` in the page cache."""
        return scratch.cached_share(self._fd, self._map, start, end) if self._map is not None else 1.0

    def reads_direct(self) -> bool:
        """Whether the copy's file system reads it around the page cache (``O_DIRECT``; not tmpfs)."""
        if self._direct is None:
            try:
                os.close(os.open(self.file, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC))
                self._direct = True
            except OSError:
                self._direct = False
        return self._direct

    @property
    def complete(self) -> bool:
        """Whether every source row group is copied (windows then need no filling)."""
        return self._complete

    @property
    def filled(self) -> int:
        """Source row groups copied so far."""
        return int(self.present.sum())

    def work(self) -> int:
        """Memory a window load may take to fill this copy: its largest column chunk decoded."""
        if self._complete:
            return 0
        chunk = max((self.layout.top_bytes(g, t) for g in range(len(self.present))
                     for t in range(len(self.index.footer.top))), default=0)
        return chunk + DECODE_FACTOR * min(chunk, BATCH_BYTES) + (self._largest_span() if self.remote else 0)

    def _largest_span(self) -> int:
        """The bytes of the largest source row group (held while it is copied from a bucket)."""
        footers = getattr(self.index, "member_footers", (self.index.footer,))
        return max((b - a for f in footers for a, b in f.group_spans), default=0)

    def ensure(self, groups: np.ndarray, source: Source) -> None:
        """Copy every source row group of ``groups`` not copied yet, read from ``source`` (the
        version of the index; a pool's: its members, ``source.files``).  `StaleSourceError` if a
        file changed, `FormatError` if it does not decode to the indexed rows."""
        groups = np.unique(np.asarray(groups, np.int64))
        if self.present[groups].all():
            return
        with self._fill:
            missing = groups[~self.present[groups]]
            if not len(missing):
                return
            t0 = time.monotonic()
            _system_allocator()
            files = getattr(source, "files", None) or [source]
            member_of = getattr(self.index, "member_of", lambda g: (0, g))
            footers = getattr(self.index, "member_footers", (self.index.footer,))
            stamps = getattr(self.index, "member_stamps", (self.index.stamp,))
            by_member: dict[int, list[tuple[int, int]]] = {}
            for g in missing.tolist():
                m, own = member_of(g)
                by_member.setdefault(m, []).append((g, own))
            for m, todo in sorted(by_member.items()):
                path = getattr(files[m], "path", self.path)
                pf, reader = self._open(files[m], footers[m], stamps[m], path, m)
                try:
                    for g, own in todo:
                        self._copy_group(pf, g, own, footers[m], files[m], path, reader)
                finally:
                    pf.close(force=True)  # and the file it read
                    if reader is not None:
                        self.fetched.strays += reader.strays
            self.seconds += time.monotonic() - t0
            self._complete = bool(self.present.all())
            if self._complete:
                log.info("%s: decoded copy of %d bytes in %s (%.1f s)", self.path, self.layout.size, self.file,
                         self.seconds)

    def _open(self, source: Source, footer: SourceFooter, stamp: Any, path: str,
              member: int) -> tuple[Any, RangedReader | None]:
        """``source`` as a ``pyarrow.parquet.ParquetFile``, once its footer is checked to be the
        indexed one, and the `RangedReader` it reads if it is read by row groups (no local
        descriptor: an object, whose footer is read and checked once per copy, its GETs being
        pinned to the indexed version)."""
        import pyarrow.parquet as pq

        size = stamp.size if stamp is not None else 0
        fd = getattr(source, "fd", None)  # a local file: read by pyarrow's own preads, no Python in between
        local = isinstance(fd, int) and os.path.exists(f"/proc/self/fd/{fd}")
        reader = None if local else self.fetched.reader(member, source, size)
        if reader is None or not reader.pieces:
            read = source.read_range if reader is None else reader.fetch
            if read_footer(size, read, path).digest != footer.digest:
                raise StaleSourceError(path, None, "its footer changed since it was indexed")
            if reader is not None:
                self.fetched.keep_tail(member, reader)
        try:
            if reader is None:
                import pyarrow as pa

                return pq.ParquetFile(pa.OSFile(f"/proc/self/fd/{fd}")), None
            self.remote = True
            return pq.ParquetFile(reader), reader
        except (OSError, StaleSourceError):
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for bad files
            raise FormatError(path, None, f"cannot be opened as Parquet: {e}") from None

    def _copy_group(self, pf: Any, g: int, own: int, footer: SourceFooter, source: Source, path: str,
                    reader: RangedReader | None = None) -> None:
        """Copy pooled row group ``g``, row group ``own`` of the file of ``footer`` (its bytes
        fetched whole first when ``reader`` reads an object)."""
        span = footer.group_spans[own] if own < len(footer.group_spans) else (0, 0)
        held = group_bytes(source, span) if reader is not None else None
        if held is not None:
            reader.hold(span[0], held)  # type: ignore[union-attr]
            self.fetched.groups += 1
        try:
            rows = max(1, int(footer.group_rows[own]))
            for top in range(len(footer.top)):
                leaves = [leaf for leaf in footer.leaves if leaf.top == top]
                batch = max(1024, BATCH_BYTES * rows // max(1, self.layout.top_bytes(g, top)))
                for first, datas in decode_top_batches(pf, footer, own, top, path, batch):
                    if self.stop.is_set():
                        raise StageError(self.path, None, "the mount is stopping: its decoded copy was left unfilled")
                    for offset, data in group_pieces(self.layout, g, leaves, datas, path, first):
                        scratch.pwrite_all(self._fd, data, offset)
                    del datas
        finally:
            if held is not None:
                reader.drop(span[0])  # type: ignore[union-attr]
        source.verify_open()  # decoded from the indexed version
        self.present[g] = True

    def close(self, keep: Callable[[RowCopy], bool] | None = None) -> None:
        """Remove the copy (no view reads it any more), unless ``keep`` took its file."""
        self.streams = None  # type: ignore[assignment]
        if keep is None or not keep(self):
            try:
                os.unlink(self.file)
            except FileNotFoundError:
                pass
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an array over it is still referenced: unmapped when it goes
                pass
        os.close(self._fd)


def _system_allocator() -> None:
    """Let pyarrow allocate through malloc, which gives a decoded row group's memory back to the
    system when it is freed (the daemon maps large blocks on their own, `fs.daemon`), where
    pyarrow's own allocator kept it: measured on a 1 GiB file, the daemon's own memory stayed at
    500-620 MiB after its copy was made."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())


def _same(a: ParquetIndex, b: ParquetIndex) -> bool:
    """Whether two indexes describe the same rows of the same version (a copy laid out by one
    serves views of the other): one object, or equal stamps and row sizes."""
    if a is b:
        return True
    versions = [getattr(i, "member_stamps", (i.stamp,)) for i in (a, b)]
    if versions[0] != versions[1] or a.footer.digest != b.footer.digest:
        return False
    x, y = a.sizes.to_arrays(), b.sizes.to_arrays()
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


COPY_FORMAT = 1
"""The format of a copy's streams (`formats.parquet.streams`): with where its streams lie, part of a
kept copy's version, so a copy kept by a mount that lays copies out otherwise is never read."""


def _kept_key(path: str, index: ParquetIndex, streams: StreamLayout) -> tuple[str, SourceStamp, str] | None:
    """(the name, version and layout a copy laid out as ``streams`` is kept under), or None if a
    file's version is not known.  A pool's version is every member's (their stamps in its layout)."""
    stamps = getattr(index, "member_stamps", (index.stamp,))
    if not stamps or any(s is None for s in stamps):
        return None
    digest = hashlib.blake2b(digest_size=12)  # where every stream lies: a copy laid out otherwise never matches
    for part in (streams.group_values, streams.group_entries, streams.values, streams.defs, streams.reps,
                 streams.value_offsets, streams.entry_offsets):
        digest.update(np.ascontiguousarray(part).tobytes())
    layout = f"{COPY_FORMAT}\0{index.footer.digest}\0{streams.size}\0{digest.hexdigest()}"
    if hasattr(index, "member_stamps"):
        layout += "\0" + ";".join(f"{s.size},{s.mtime_ns},{s.ino},{s.ctime_ns}" for s in stamps)
        return f"parquet\0{path}", SourceStamp(sum(s.size for s in stamps), 0, 0, 0), layout
    return f"parquet\0{path}", stamps[0], layout


class RowCopies:
    """The mount's Parquet copies (module docstring), one per file, under ``root``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)
        self._lock = threading.Lock()
        self._copies: dict[str, RowCopy] = {}
        self._retired: list[RowCopy] = []
        self._dir: str | None = None
        self._hold = -1
        self._made = 0
        self.disk = CopyDisk(self.root)
        self.stop = threading.Event()
        """Set when the mount stops: copies being filled end at their next batch (`RowCopy.stop`),
        so that a stop does not wait for a whole file to be decoded (a part filled copy is not kept)."""

    def acquire(self, path: str, index: ParquetIndex) -> RowCopy:
        """The copy of ``path`` at ``index``'s version (made now, empty, if there is none), with
        one more user; `release` it."""
        with self._lock:
            got = self._copies.get(path)
            if got is not None and _same(got.index, index):
                got.users += 1
                return got
            directory = self._directory()
            self._made += 1
            stamp = index.stamp
            name = os.path.join(directory, f"{self._made}-{stamp.ino if stamp else 0}-{stamp.mtime_ns if stamp else 0}")
            streams = StreamLayout(index.footer, index.sizes)
            copy = self._take_kept(path, index, streams, name)
            if copy is None:
                self.disk.kept.trim(streams.size)  # kept copies give way
                copy = RowCopy(path, index, name, layout=streams)
            copy.stop = self.stop
            if got is not None:
                self._retire(got)
            self._copies[path] = copy
            copy.users += 1
            return copy

    def release(self, copy: RowCopy) -> None:
        with self._lock:
            copy.users -= 1
            if copy.users == 0 and copy in self._retired:
                self._retired.remove(copy)
                copy.close()

    def _retire(self, copy: RowCopy) -> None:
        """``copy`` is replaced (a new version, or an index found wrong): removed once unused."""
        if copy.users == 0:
            copy.close()
        else:
            self._retired.append(copy)

    def directory(self) -> str:
        """The copies' directory (made now if need be), where stages of views go too."""
        with self._lock:
            return self._directory()

    def _directory(self) -> str:
        if self._dir is None:
            os.makedirs(self.root, exist_ok=True)
            self._dir, self._hold = scratch.held(self.root, COPY_PREFIX)
        return self._dir

    def describe(self) -> dict[str, Any]:
        """For ``shufflefs stat``: the copies, how far filled, and where they are."""
        with self._lock:
            copies = {p: {"bytes": c.layout.size, "row_groups": len(c.present), "copied": c.filled, "views": c.users,
                          "seconds": round(c.seconds, 2), "made": c.made,
                          **({"fetched_row_groups": c.fetched.groups, "stray_reads": c.fetched.strays}
                             if c.remote else {})} for p, c in self._copies.items()}
        return {"dir": self._dir or self.root, "copies": copies, "bytes": sum(c["bytes"] for c in copies.values())}

    def close(self) -> None:
        """Remove every copy (at unmount)."""
        with self._lock:
            copies, retired = list(self._copies.values()), self._retired
            self._copies, self._retired = {}, []
            directory, hold = self._dir, self._hold
            self._dir, self._hold = None, -1
        for copy in retired:
            copy.close()
        for copy in copies:  # the next mount reads the whole ones (`kept_copies`)
            copy.close(self._keep)
        self.disk.kept.trim()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if hold >= 0:
            os.close(hold)

    def _take_kept(self, path: str, index: ParquetIndex, streams: StreamLayout, into: str) -> RowCopy | None:
        """The copy of this version an earlier mount kept (`kept_copies`), moved to ``into``."""
        key = _kept_key(path, index, streams)
        if key is None or self.disk.kept.take(key[0], key[1], streams.size, into, layout=key[2]) is None:
            return None
        try:
            copy = RowCopy(path, index, into, taken=True, layout=streams)
        except OSError as e:  # (removed meanwhile): made again instead
            log.warning("%s: the decoded copy an earlier mount kept cannot be opened (%s): made again", path, e)
            return None
        log.info("%s: read from the decoded copy an earlier mount kept, now %s", path, into)
        return copy

    def _keep(self, copy: RowCopy) -> bool:
        """At unmount: move a whole copy of a local file to the kept copies for the next mount."""
        key = _kept_key(copy.path, copy.index, copy.layout)
        return (key is not None and copy.complete and not copy.remote
                and self.disk.kept.keep(key[0], key[1], copy.file, layout=key[2]))
