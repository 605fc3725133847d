"""A stage built from a decoded copy that is not in the page cache: its largest stream read once,
front to back, around the page cache, and each row's values put where the stage wants them.

A view's windows each take rows from every part of the copy (that is what mixes a sorted file),
so a stage gathered window by window needs the whole copy in the page cache first.  The first
epoch of a later mount finds its kept copy on disk only: it read the copy into new page-cache
pages (1.13 GiB for a 1.02 GiB file) before its first window, and wrote the stage into as many
again (docs/benchmark.md).  Here the copy's largest value stream (a text or binary column: most
of the copy) is read by ``O_DIRECT`` in pieces, several at a time, each into a buffer of its
reader's, whose rows are copied into the stage through a writable mapping of it, at the places
the layout gives (`ParquetView.value_places`); meanwhile the windows are encoded without those
values (every other stream, small, gathered from the page cache as before) and written around
them.  Blocking (worker threads), no FUSE.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any

import numpy as np

from ..errors import StageError
from ..formats.parquet.encode import copy_runs

__all__ = ["PIECE", "Scatter", "deferred_leaf"]

PIECE = 8 << 20
"""Bytes of the copy one reader reads at a time."""
READERS = 4
"""Reads in flight: measured on a 1.13 GiB copy, the page cache dropped, ``O_DIRECT`` reads of 16
MiB gave 0.88 GB/s one at a time, 1.26 four at a time, 1.35 eight (2026-12-01)."""
DIRECT_ALIGN = 4096
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
BUDGET = 64 << 20
"""Memory a scatter may take, out of the fixed part of the daemon's bound (SEMANTICS.md
[memory-bound]): a place (8 bytes) per row, and its readers' buffers (or, before them, the
rows' run ends, 8 bytes each); a file of more rows (about 4 M) gathers, as when its copy is in
the page cache."""
SHARE = 0.5
"""A leaf's value stream is read around the page cache when it is at least this share of the copy
and less than this share of it is in the page cache."""


def deferred_leaf(view: Any) -> int | None:
    """The leaf whose values a stage of ``view`` takes by `Scatter`, or None (gather them all):
    the copy's largest stream, if it is of variable width, at least `SHARE` of the copy, mostly
    not in the page cache, and on a file system that reads around the page cache; and the file
    has rows few enough for `BUDGET`."""
    copy = view.copy
    lay, streams = copy.layout, copy.streams
    n = lay.sizes.n_rows
    if not copy.complete or not lay.size or not len(lay.values) or 8 * n + max(8 * n, READERS * PIECE) > BUDGET:
        return None
    sizes = lay.group_values[-1]
    c = int(np.argmax(sizes))
    if sizes[c] < SHARE * lay.size or streams.runs(c)[0] is None or lay.sizes.booleans[c]:
        return None
    a = int(lay.values[c])
    if copy.cached_share(a, a + int(sizes[c])) >= SHARE or not copy.reads_direct():
        return None
    return c


class Scatter:
    """Leaf c's value runs of every source row, copied from the copy into the stage file ``fd``
    (``size`` bytes) at ``places`` (by source row), by `READERS` threads (`run`)."""

    def __init__(self, view: Any, c: int, places: np.ndarray, fd: int, size: int,
                 halt: threading.Event | None = None) -> None:
        """``halt``: set when the mount stops (no piece more is read)."""
        copy = view.copy
        lay = copy.layout
        self.path, self.file = view.path, copy.file
        runs = copy.streams.runs(c)[0]
        n = lay.sizes.n_rows
        if runs is None or len(places) != n or (n and int(places.min()) < 0):
            raise StageError(view.path, None, f"column {c}: a row's values have no place in the stage")
        self.places, self.runs = places, runs
        self.lens = np.asarray(lay.sizes.columns[c].values)  # of each row's run, in the index's own type
        self.piece = max(PIECE, _aligned_up(int(self.lens.max(initial=0)) + DIRECT_ALIGN))
        self.pieces = _pieces(runs, runs + self.lens, self.piece)  # their ends only meanwhile: `BUDGET`
        self.failed: list[BaseException] = []
        self.halt = halt or threading.Event()
        self._next = 0
        self._lock = threading.Lock()
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) if size else None

    def run(self) -> None:
        """Every piece, `READERS` at a time; raises the first failure (`StageError`)."""
        if self._map is not None:
            try:  # the mapping's page tables in one call, not a fault a page
                self._map.madvise(MADV_POPULATE_WRITE)
            except OSError:
                pass
        threads = [threading.Thread(target=self._work, name="scatter", daemon=True)
                   for _ in range(min(READERS, len(self.pieces)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._map is not None:
            self._map.close()
        if self.failed:
            raise self.failed[0]

    def _work(self) -> None:
        buf = stage = src = None
        fd = -1
        try:
            fd = os.open(self.file, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            buf = mmap.mmap(-1, self.piece)
            stage = np.frombuffer(self._map, np.uint8)  # type: ignore[arg-type]
            while True:
                with self._lock:
                    if self.failed or self._next >= len(self.pieces):
                        return
                    if self.halt.is_set():
                        raise StageError(self.path, None, "the mount is stopping: its stage was left unwritten")
                    r0, r1, at = self.pieces[self._next]
                    self._next += 1
                size = _read(fd, buf, at)
                lens = self.lens[r0:r1].astype(np.int64)
                if int(self.runs[r1 - 1]) + int(lens[-1]) - at > size:
                    raise StageError(self.path, at, f"the decoded copy {self.file} reads short at byte {at + size}")
                src = np.frombuffer(buf, np.uint8, count=size)
                copy_runs(stage, self.places[r0:r1], src, self.runs[r0:r1] - at, lens)
                src = None
        except BaseException as e:  # noqa: BLE001 - raised by `join`
            with self._lock:
                self.failed.append(e if isinstance(e, StageError) else StageError(
                    self.path, None, f"the decoded copy {self.file} could not be read: {e}"))
        finally:
            stage = src = None
            if fd >= 0:
                os.close(fd)
            if buf is not None:
                buf.close()


def _read(fd: int, buf: mmap.mmap, at: int) -> int:
    """Bytes read into ``buf`` from ``at`` (fewer at the file's end)."""
    size = 0
    view = memoryview(buf)
    try:
        while size < len(buf):
            k = os.preadv(fd, [view[size:]], at + size)
            if k <= 0:
                break
            size += k
    finally:
        view.release()
    return size


def _aligned_up(x: int) -> int:
    return -(-x // DIRECT_ALIGN) * DIRECT_ALIGN


def _pieces(runs: np.ndarray, ends: np.ndarray, piece: int) -> list[tuple[int, int, int]]:
    """``(first row, end row, file offset)`` of each read: rows whose runs lie whole within
    ``piece`` bytes from an aligned offset at or before the first one's (``piece`` at least
    the longest run and an alignment: else ValueError)."""
    out, r, n = [], 0, len(runs)
    while r < n:
        at = int(runs[r]) // DIRECT_ALIGN * DIRECT_ALIGN
        r1 = int(np.searchsorted(ends, at + piece, "right"))
        if r1 <= r:
            raise ValueError(f"row {r}: its run of {int(ends[r] - runs[r])} bytes does not fit a piece of {piece}")
        out.append((r, r1, at))
        r = r1
    return out
