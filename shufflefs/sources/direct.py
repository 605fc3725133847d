"""Window loads that bypass the page cache (``--source-cache direct``): a window's runs read with
``O_DIRECT`` by several threads at once into one aligned buffer, whole aligned pieces of up to
`PIECE` bytes, no page of the source inserted into the page cache (no readahead, no reclaim, no
4 KiB folios); the window is then copied from that buffer in view order by the compiled gather,
with the same framing checks, and the source is verified against its stamp afterwards, as after
preads.  Pure I/O helpers; `windows.view` decides when they are used.
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .base import Members
from .local import SourceFile

ALIGN = 4096
"""Offsets, lengths and the buffer of an O_DIRECT read are multiples of this (a page: at least
any device's logical block)."""
PIECE = 4 << 20
"""The largest single read: the virtio disk's largest request (``max_sectors_kb`` 4096)."""
THREADS = 32
"""Reads in flight at once.  Measured on a 2-core VM's virtio disk, O_DIRECT random reads of
128 KiB (the default order's blocks): 0.92 GB/s one at a time, 1.13 with 8 in flight, 1.24 with
32, 1.40 with 64; the default view of 2 GiB in a 512 MiB cgroup read 0.65 GB/s with 8 threads,
0.76 with 32 (`tools/lirs_penalty.py`, 2 rounds each)."""
KEEP = 2
"""Aligned buffers kept for the next loads, shared by every view (the others are unmapped when
their load ends): a load holds one besides its window while it runs (`serve.parquet_views.work_of`
counts it in the memory limit)."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_free: list[mmap.mmap] = []


def pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="shufflefs-direct")
        return _pool


class Unsupported(OSError):
    """The file cannot be read with O_DIRECT here (tmpfs, some network filesystems): its view
    reads it buffered instead."""


def open_direct(fd: int) -> int:
    """A second descriptor of the file open as ``fd`` (the same inode, checked), with O_DIRECT;
    `Unsupported` if the filesystem refuses O_DIRECT."""
    try:
        d = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as e:
        raise Unsupported(e.errno, f"O_DIRECT: {e.strerror}") from None
    a, b = os.fstat(fd), os.fstat(d)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(d)
        raise Unsupported(0, "the O_DIRECT descriptor names another file")
    return d


def plan_spans(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranges ``[starts, ends)`` (ascending, disjoint) as aligned spans, overlapping or touching
    ones merged: ``(span_lo, span_hi, where)``, ``where[r]``: the buffer position of byte
    ``starts[r]`` when the spans are laid end to end."""
    lo = starts & ~(ALIGN - 1)
    hi = (ends + ALIGN - 1) & ~(ALIGN - 1)
    new = np.ones(len(lo), bool)
    if len(lo) > 1:
        new[1:] = lo[1:] > np.maximum.accumulate(hi)[:-1]
    group = np.cumsum(new) - 1
    span_lo = lo[new]
    span_hi = np.maximum.reduceat(hi, np.flatnonzero(new)) if len(lo) else hi[:0]
    pos = np.concatenate([[0], np.cumsum(span_hi - span_lo)[:-1]]).astype(np.int64) if len(lo) else lo[:0]
    where = pos[group] + (starts - span_lo[group])
    return span_lo.astype(np.int64), span_hi.astype(np.int64), where.astype(np.int64)


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Anonymous memory (page-aligned), asked for transparent huge pages."""
    m = mmap.mmap(-1, max(nbytes, ALIGN))
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m


def read_spans(fd: int, span_lo: np.ndarray, span_hi: np.ndarray, buf: mmap.mmap, size: int,
               plain_fd: int) -> int | None:
    """Read the spans end to end into ``buf`` by `THREADS` threads, `PIECE` bytes a read; the
    file offset where it ended early (the file is shorter than ``size`` now), else None.  A read
    cut short inside the file at an unaligned offset goes on from ``plain_fd`` (buffered)."""
    pieces: list[tuple[int, int, int]] = []  # (file offset, length, buffer position)
    pos = 0
    for a, b in zip(span_lo.tolist(), span_hi.tolist()):
        for o in range(a, b, PIECE):
            n = min(PIECE, b - o)
            pieces.append((o, n, pos))
            pos += n
    view = memoryview(buf)

    def read(piece: tuple[int, int, int]) -> int | None:
        off, n, at = piece
        got, src = 0, fd
        while got < n:
            k = os.preadv(src, [view[at + got: at + n]], off + got)
            if k == 0:
                return off + got if off + got < size else None  # past the end of the file: fine
            got += k
            if (off + got) % ALIGN:  # the end of the file, or a cut-short read: on unaligned
                if off + got >= size:
                    return None
                src = plain_fd
        return None

    def read_share(i: int) -> int | None:  # one task per thread, not per piece: fewer handoffs
        ends = [s for s in map(read, pieces[i::THREADS]) if s is not None]
        return min(ends) if ends else None

    short = [s for s in pool().map(read_share, range(min(THREADS, len(pieces)))) if s is not None]
    return min(short) if short else None


class DirectReader:
    """A view's O_DIRECT descriptor and aligned buffers (one per load in flight, kept for the
    next loads), opened on first use."""

    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self._fd = -1
        self._lock = threading.Lock()

    def read(self, bounds: np.ndarray, first: np.ndarray, count: np.ndarray) -> tuple[Members, mmap.mmap]:
        """Runs ``(first, count)`` read into a buffer: ``(members, buffer)``, the members placing
        each run's records in it for `_gather.gather_mapped`; give the buffer back with
        `release`.  `StaleSourceError` if the file ended early."""
        starts, ends = bounds[first], bounds[first + count]
        lo, hi, where = plan_spans(starts, ends)
        need = int((hi - lo).sum())
        with self._lock:
            if self._fd < 0:
                self._fd = open_direct(self.source.fd)
        with _pool_lock:
            fits = [i for i, m in enumerate(_free) if need <= len(m) <= 2 * need]
            buf = _free.pop(fits[0]) if fits else None
        buf = buf if buf is not None else aligned_buffer(need)
        try:
            short = read_spans(self._fd, lo, hi, buf, self.source.stamp.size, self.source.fd)
            if short is not None:
                self.source.ended(short)  # raises: the file is shorter than its stamp says
        except BaseException:
            self.release(buf)
            raise
        mf, shift = first.astype(np.int64), (where - starts).astype(np.int64)
        if len(mf) == 0 or mf[0] != 0:  # members start at record 0 (one before the first run, never read)
            mf, shift = np.concatenate([[0], mf]), np.concatenate([[0], shift])
        fds = np.full(len(mf), self.source.fd, np.int64)
        return Members((buf,), mf, np.zeros(len(mf), np.int64), shift, fds), buf

    def release(self, buf: mmap.mmap) -> None:
        with _pool_lock:
            _free.append(buf)
            _free.sort(key=len, reverse=True)
            del _free[KEEP:]  # unmapped once no one else holds them

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
