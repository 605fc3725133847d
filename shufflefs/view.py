"""One shuffled view of one source file for one epoch: blocking I/O, run from worker threads.

A `View` owns no FUSE state; the filesystem layer calls `load_window` from a thread and slices
the result.  Every load checks the source against the stamp its index was built from (before
and after reading), so a file changed or removed while mounted yields `StaleSourceError`
instead of bytes that mix two versions.

A window load (`View.load_window`) is one compiled call (`_gather.build_window`) that holds
no GIL: one pass over the window's runs in ascending source order, reading `READ_CHUNK` bytes at
a time into a small scratch buffer and copying each record of the chunk to its place in the
window while the chunk is still in the CPU cache.  Without the compiled module,
`layout.assemble` does the same work (all runs into a window-sized scratch, then a numpy
gather), several times slower.  For a sequential reader the load then asks the kernel to read
the next window's blocks into the page cache (``POSIX_FADV_WILLNEED``), so that a cold disk
works on them while this window is served and the next load starts.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Callable, NamedTuple, Protocol

import numpy as np

from . import resolve
from .errors import StaleSourceError
from .formats.base import WindowCheck
from .index import RecordIndex, SourceStamp
from .layout import Layout, assemble, id_runs
from .pooled import PooledIndex, split_runs

try:
    from ._gather import build_window as _build_window  # compiled at install time; optional
except ImportError:  # pragma: no cover - depends on the build (or an older build of it)
    _build_window = None
from .strategies.base import Plan

READ_CHUNK = 1 << 20
"""Scratch bytes read at once while building a window (a chunk ends at a record boundary).
Measured on a 2-core EPYC VM (1 MiB L2 per core) building 64 MiB corgipile windows of ~1 KiB
records from the page cache (CPU time, three runs of five interleaved rounds): 512 KiB - 2 MiB
chunks 5.0-5.2 GB/s, 4 MiB (one read per block) 4.8-5.0, 128 KiB 4.5-4.7.  A whole load (ids,
runs, build) runs at 3.7-3.9 GB/s; the previous design (read all of the window's runs into a
window-sized scratch, sort, then gather) at 1.7-2.4 GB/s."""
RECORD_CHUNK = 1 << 17
"""Records built per pass of a sparse record-level window (``full``, ``lirs``... over a file much
larger than the window), so that the build's working arrays (`LOAD_WORK_RECORDS` bytes per
record: ids, runs, files, shifts, view positions) stay near 7 MB instead of growing with the
window: a 64 MiB window of 50-byte records took 70 MB more than the window itself.  Each pass
reads its records in ascending order.  A dense window is built in one pass, whose sorted ids
merge into long runs: on a 2-core VM (64 MiB window of 50-byte records, 91% of the file's
records) one pass took 0.5-0.6 s, passes of 2**17 records 1.4-1.6 s (a pread per record)."""
SPARSE = 0.25
"""Windows holding less than this share of their index's records are built in passes."""
LOAD_WORK_RUNS, LOAD_WORK_RECORDS = 24, 56
"""Working bytes per record of a window build besides the window, counted in the memory limit
while the load runs (`window_work`): a window of runs holds its ids twice (the plan's, int64 for
the build) and every record's view position; a record-level window also holds its runs (first,
count, file, shift), about one per record in a sparse window."""
HINT_RUN = 2 * READ_CHUNK
"""Runs at least this long get the readahead hint; the kernel's own readahead covers shorter
ones.  Measured on the same VM, cold page cache, 512 MiB of corgipile windows (4 MiB blocks)
loaded back to back, median of six rounds: hinting the next window after each load 1.26 GB/s,
hinting each window's own blocks before reading them 1.13, no hint 1.14: on that virtual disk a
deeper queue alone gained nothing, overlapping disk time with the copying did."""


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


class Reader(Protocol):
    """A file a run can lie in (a source file, or a stage file): reports its own failures."""

    def ended(self, offset: int) -> None: ...

    def verify_read(self, offset: int | None) -> None: ...


def build_runs(out: np.ndarray, scratch: np.ndarray, index: RecordIndex, ids: np.ndarray, runs: Runs,
               newline_ids: np.ndarray, file_of: Callable[[int], Reader]) -> np.ndarray:
    """Records ``ids`` (view order; the same records as ``runs``) read into ``out`` in one pass
    (see the module docstring); ``file_of(fd)`` names the file behind a descriptor.  Every file
    read is verified afterwards, so bytes of a file that changed meanwhile are never returned."""
    c = np.ascontiguousarray
    fds = c(runs.fd, np.int64)
    got = _build_window(out, scratch, index.bounds, c(ids, np.int64), c(runs.first, np.int64),
                        c(runs.count, np.int64), fds, c(runs.shift, np.int64), newline_ids)
    if isinstance(got, tuple):  # (run, file offset): that file ended early
        file_of(int(fds[got[0]])).ended(got[1])
        raise OSError(errno.EIO, "a file ended early")  # ended() raises; never serve a short window
    if len(fds):
        used, at = np.unique(fds, return_index=True)
        offsets = index.bounds[runs.first[at]] + runs.shift[at]
        for fd, off in zip(used.tolist(), offsets.tolist()):
            file_of(fd).verify_read(off)
    return out[:got]


class SourceFile:
    """An open source file pinned to the stamp of its index."""

    local_fd = -1  # no run of a source lies in a local stage file

    def __init__(self, path: str, stamp: SourceStamp) -> None:
        self.path = path
        self.stamp = stamp
        try:
            self.fd = resolve.open_path(path)
        except FileNotFoundError:
            raise StaleSourceError(path, None, "source file was removed") from None
        try:
            self._verify(os.fstat(self.fd), None)
        except BaseException:
            os.close(self.fd)
            raise

    def _verify(self, st: os.stat_result, offset: int | None) -> None:
        if st.st_nlink == 0:
            raise StaleSourceError(self.path, offset, "source file was removed or replaced while mounted")
        if not self.stamp.matches(st):
            now = SourceStamp.of(st)
            raise StaleSourceError(
                self.path,
                offset,
                f"source changed while mounted (size {self.stamp.size} -> {now.size}, "
                f"mtime_ns {self.stamp.mtime_ns} -> {now.mtime_ns}, ctime_ns {self.stamp.ctime_ns} -> "
                f"{now.ctime_ns}, inode {self.stamp.ino} -> {now.ino})",
            )

    def verify_open(self) -> None:
        """Cheap per-read check (one fstat, no path lookup): the open file is unchanged and still
        linked, so bytes of a window loaded earlier still describe the source."""
        st = os.fstat(self.fd)
        if st.st_nlink == 0 or not self.stamp.matches(st):
            self._verify(st, None)

    def check(self, offset: int | None = None) -> None:
        """Raise unless the path still names the same, unchanged file."""
        try:
            st = resolve.stat_path(self.path)
        except FileNotFoundError:
            raise StaleSourceError(self.path, offset, "source file was removed") from None
        self._verify(st, offset)

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Read the ranges in the given (ascending) order into one buffer."""
        total = int((ends - starts).sum())
        buf = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
        pos = 0
        for s, e in zip(starts.tolist(), ends.tolist()):
            self._pread_into(buf[pos: pos + e - s], s)
            pos += e - s
        self._verify(os.fstat(self.fd), int(starts[0]) if len(starts) else None)
        return buf

    def _pread_into(self, buf: np.ndarray, offset: int) -> np.ndarray:
        """Fill ``buf`` from ``offset``; an early end of file means the source shrank."""
        mv = memoryview(buf)
        pos, end = 0, len(buf)
        while pos < end:
            got = os.preadv(self.fd, [mv[pos:]], offset + pos)
            if got == 0:
                self._verify(os.fstat(self.fd), offset + pos)
                raise StaleSourceError(self.path, offset + pos, "unexpected end of file")
            pos += got
        return buf

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs:
        """Where the runs of ids lie: all in this file, unshifted."""
        return Runs(first, count, np.full(len(first), self.fd, np.int64), np.zeros(len(first), np.int64))

    def file_of(self, fd: int) -> "SourceFile":
        return self

    def ended(self, offset: int) -> None:
        """The file ended before ``offset``: it shrank (or changed) while mounted."""
        self._verify(os.fstat(self.fd), offset)
        raise StaleSourceError(self.path, offset, "unexpected end of file")

    def verify_read(self, offset: int | None) -> None:
        """After reading from ``offset``: the file is still the one the index describes."""
        self._verify(os.fstat(self.fd), offset)

    def advise(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> None:
        """Ask the kernel to read the runs' bytes into the page cache (returns at once)."""
        b = index.bounds
        for s, e in zip(b[first].tolist(), b[first + count].tolist()):
            os.posix_fadvise(self.fd, s, e - s, os.POSIX_FADV_WILLNEED)

    def read_range(self, start: int, end: int) -> bytes:
        return self.read_runs(np.array([start]), np.array([end])).tobytes()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PoolSource:
    """The member files of a pool, each pinned to its stamp; shared by the views of the pool's
    shards (one descriptor per member however many shards are open), closed by its last user."""

    local_fd = -1

    def __init__(self, paths: list[str], index: PooledIndex) -> None:
        self.index = index
        self.files: list[SourceFile] = []
        self._users = 1
        self._lock = threading.Lock()
        try:
            for p, stamp in zip(paths, index.member_stamps):
                self.files.append(SourceFile(p, stamp))
        except BaseException:
            self._close()
            raise
        self.fds = np.array([f.fd for f in self.files], np.int64)
        self._by_fd = {f.fd: m for m, f in enumerate(self.files)}

    @property
    def closed(self) -> bool:
        return self._users == 0

    def share(self) -> "PoolSource":
        """One more user (a view); each calls `close` once."""
        with self._lock:
            if self._users == 0:
                raise OSError(errno.EBADF, "pool source closed")
            self._users += 1
        return self

    def check(self) -> None:
        for f in self.files:
            f.check()

    def verify_open(self) -> None:
        for f in self.files:
            f.verify_open()

    def place(self, index: PooledIndex, first: np.ndarray, count: np.ndarray) -> Runs:
        """The runs cut where members end, each in its member file at the member's shift."""
        first, count, member = index.split_runs(first, count)
        return Runs(first, count, self.fds[member], index.shifts[member])

    def file_of(self, fd: int) -> SourceFile:
        return self.files[self._by_fd[fd]]

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Pooled byte ranges (ascending, perhaps across members), concatenated (the fallback
        build without the compiled module): cut where members start, one read per member stretch."""
        index = self.index
        first, count, member = split_runs(index.bounds[index.member_firsts], starts, np.asarray(ends) - starts)
        total = int(count.sum())
        buf = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
        pos = 0
        for piece in np.split(np.arange(len(member)), np.flatnonzero(np.diff(member)) + 1):
            if len(piece):
                m, size = int(member[piece[0]]), int(count[piece].sum())
                at = first[piece] + index.shifts[m]
                self.files[m].read_runs(at, at + count[piece], buf[pos: pos + size])
                pos += size
        return buf

    def read_range(self, start: int, end: int) -> bytes:
        raise ValueError("a view over a pool needs its header and trailer")

    def advise(self, index: PooledIndex, first: np.ndarray, count: np.ndarray) -> None:
        first, count, member = index.split_runs(first, count)
        b = index.bounds
        starts, ends = b[first] + index.shifts[member], b[first + count] + index.shifts[member]
        for m, s, e in zip(member.tolist(), starts.tolist(), ends.tolist()):
            os.posix_fadvise(self.files[m].fd, s, e - s, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self._close()

    def _close(self) -> None:
        for f in self.files:
            f.close()


class Source(Protocol):
    """What a view reads records from: `SourceFile`, `PoolSource` or `stage.StagedSource`."""

    local_fd: int

    def check(self) -> None: ...

    def verify_open(self) -> None: ...

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs: ...

    def file_of(self, fd: int) -> Reader: ...

    def read_range(self, start: int, end: int) -> bytes: ...

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...

    def advise(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> None: ...

    def close(self) -> None: ...


Meter = Callable[[int, int], None]
"""Told the record bytes of every window load: ``(from the source, from a local stage)``."""


def _sparse(plan: Plan, records: int) -> bool:
    return records < SPARSE * plan.index.n


def window_work(plan: Plan, k: int | None = None) -> int:
    """Bytes a load of window k works with besides the window (an estimate, see
    `LOAD_WORK_RUNS`); None: the most any window of the plan needs."""
    sizes = np.asarray(plan.window_records)
    if len(sizes) == 0:
        return 0
    records = int(sizes[k] if k is not None else sizes.max())
    if plan.window_runs(k if k is not None else int(np.argmax(sizes))) is not None:
        return LOAD_WORK_RUNS * records
    if _sparse(plan, records):
        return LOAD_WORK_RECORDS * min(records, RECORD_CHUNK)
    # a dense random window: a record starts a run when the one before it is not in the window
    runs = records * (1 - records / max(plan.index.n, 1)) + 1
    return int(LOAD_WORK_RUNS * records + (LOAD_WORK_RECORDS - LOAD_WORK_RUNS) * runs)


class View:
    """Layout + source for one (file, epoch): turns window numbers into bytes.

    A shard of a pool passes its ``source`` (the pool's files, shared) and ``frame`` (the
    header and trailer bytes it shows); a staged view passes a `stage.StagedSource`; a single
    file opens its own source and reads its header and trailer from it."""

    def __init__(self, path: str, index: RecordIndex, plan: Plan, source: Source | None = None,
                 frame: tuple[bytes, bytes] | None = None, meter: Meter | None = None,
                 check: WindowCheck | None = None) -> None:
        self.path = path
        self.check = check
        self.index = index
        self.plan = plan
        self.meter = meter
        own = source is None
        if own:
            if index.stamp is None:
                raise ValueError("a mounted view needs an index with a source stamp")
            source = SourceFile(path, index.stamp)
        self.source: Source = source
        try:
            if frame is None:
                frame = (source.read_range(0, index.header_end), source.read_range(index.trailer_start, index.size))
        except BaseException:
            if own:
                source.close()
            raise
        self.header, self.trailer = frame
        self.layout = Layout(index, plan, len(self.header), len(self.trailer))

    @property
    def size(self) -> int:
        return self.layout.size

    def load_window(self, k: int, out: np.ndarray | None = None, scratch: np.ndarray | None = None,
                    ahead: bool = False, plan: Plan | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Window k's bytes, built in ``out`` if it is large enough (blocking); ``ahead``: then
        hint the next window's blocks (for a sequential reader).  ``plan``: window k of that plan
        over the same index instead (a shard loads its pool stream's windows).

        Returns ``(window, scratch)``: the scratch buffer used, for the caller to reuse.  Reusing
        both buffers across loads avoids first-touching fresh memory for every window.
        """
        self.source.check()
        plan = self.plan if plan is None else plan
        size = self.layout.window_size(k) if plan is self.plan else int(plan.window_sizes[k])
        ids = plan.window(k)
        if out is None or len(out) < size:
            out = np.empty(size, np.uint8)
        if _build_window is None:
            window = assemble(self.index, ids, self.source.read_runs, out)
            if self.check is not None:
                self.check(window, ids, self.index, self.path)
            return window, scratch
        if scratch is None:
            scratch = np.empty(READ_CHUNK, np.uint8)
        runs = plan.window_runs(k)
        step = RECORD_CHUNK if runs is None and _sparse(plan, len(ids)) else max(len(ids), 1)
        passes = [(ids[lo: lo + step], runs) for lo in range(0, max(len(ids), 1), step)]
        pos, remote, local_bytes = 0, 0, 0
        for part, part_runs in passes:
            first, count = part_runs if part_runs is not None else id_runs(part)
            placed = self.source.place(self.index, first, count)
            pos += len(build_runs(out[pos:], scratch, self.index, part, placed, self.index.newline_ids,
                                  self.source.file_of))
            if self.meter is not None:
                nbytes, local = placed.nbytes(self.index.bounds), placed.fd == self.source.local_fd
                remote, local_bytes = remote + int(nbytes[~local].sum()), local_bytes + int(nbytes[local].sum())
            del first, count, placed
        window = out[:pos]
        if self.check is not None:
            self.check(window, ids, self.index, self.path)
        if self.meter is not None:
            self.meter(remote, local_bytes)
        if ahead and k + 1 < plan.n_windows:
            self.hint(k + 1, plan)
        return window, scratch

    def hint(self, k: int, plan: Plan | None = None) -> None:
        """Ask the kernel to read window k's long runs into the page cache (returns at once)."""
        runs = (self.plan if plan is None else plan).window_runs(k)
        if runs is None:  # a record-level order: runs of a record or two, nothing to hint
            return
        b = self.index.bounds
        long = np.flatnonzero(b[runs[0] + runs[1]] - b[runs[0]] >= HINT_RUN)
        self.source.advise(self.index, runs[0][long], runs[1][long])

    def close(self) -> None:
        self.source.close()
