"""A rank's pls partition on node-local disk, one file per epoch (``--stage-dir``).

Partial local shuffling is made for ranks that keep their partition on local storage: a rank
copies it there once and afterwards fetches from the shared source only the records it receives
("Why Globally Re-shuffle?", §III).  A stage file holds one epoch's partition: its records in
ascending id order, each with its source bytes unchanged (a newline the view adds is added when a
window is built, as it is from the source).  Its map (`StageMap`) is the ascending runs of
consecutive ids it holds, record x of run r at stage offset ``bounds[x] + shift[r]``: the form
`_gather.build_window` reads (a descriptor and a shift per run).  So a window is built from the
stage in one pass, and the next epoch's stage the same way, a chunk at a time: the records kept
from the previous stage, the received ones from the shared source.

Blocking file I/O, no FUSE: `store.StageStore` decides when stages are built and dropped.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import StageError
from ..index.table import RecordIndex
from ..windows.layout import id_runs
from ..strategies.units import cuts_by_bytes
from ..sources.base import Reader, Runs, Source, gather, take_requests
from ..windows.view import READ_CHUNK, build_runs

I64 = np.int64
STAGE_CHUNK = 16 << 20
"""Record bytes copied per step while a stage is written (the memory a build holds, besides one
record larger than that)."""
STAGE_RECORDS = 1 << 16
"""Records copied per step at most (their runs and positions are the step's working arrays), and
records placed at once in a stage: a window's or a chunk's temporaries stay a few MiB, not tens
of bytes per record of the whole partition or window."""
NO_NEWLINES = np.zeros(0, I64)


class StageCancelled(Exception):
    """A stage build stopped because the mount is going away."""


def run_ids(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The ids of ascending runs ``[first, first+count)``, in order (int64)."""
    first, count = np.asarray(first, I64), np.asarray(count, I64)
    return np.repeat(first - (np.cumsum(count) - count), count) + np.arange(int(count.sum()), dtype=I64)


@dataclass(frozen=True)
class StageMap:
    """The records a stage file holds: run r is ids ``[first[r], first[r]+count[r])``, record x
    of it at stage offset ``bounds[x] + shift[r]``."""

    first: np.ndarray
    count: np.ndarray
    shift: np.ndarray

    @classmethod
    def of(cls, bounds: np.ndarray, ids: np.ndarray) -> "StageMap":
        """The map of a stage holding records ``ids`` (sorted, distinct) back to back."""
        if len(ids) == 0:
            first = count = np.zeros(0, I64)
        else:  # `layout.id_runs` without its sort: ``ids`` are sorted already
            starts = np.flatnonzero(np.diff(ids) != 1) + 1
            first = ids[np.concatenate(([0], starts))].astype(I64)
            count = np.diff(np.concatenate(([0], starts, [len(ids)]))).astype(I64)
        nbytes = bounds[first + count] - bounds[first]
        return cls(first, count, np.cumsum(nbytes) - nbytes - bounds[first])

    @property
    def records(self) -> int:
        return int(self.count.sum())

    def nbytes(self, bounds: np.ndarray) -> int:
        return int((bounds[self.first + self.count] - bounds[self.first]).sum())

    def split(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids (sorted, distinct) as ascending runs ``(first, count, run)``: each wholly inside
        stage run ``run``, or wholly outside the stage (``run`` -1)."""
        ids = np.asarray(ids, I64)
        if len(ids) == 0:
            return ids, ids.copy(), ids.copy()
        r = np.searchsorted(self.first, ids, side="right") - 1
        ends = np.append(self.first + self.count, 0)  # r = -1 meets the 0: outside
        inside = ids < ends[r]
        r = np.where(inside, r, -1)
        starts = np.concatenate(([0], np.flatnonzero((np.diff(ids) != 1) | (np.diff(r) != 0)) + 1))
        return ids[starts], np.diff(np.append(starts, len(ids))), r[starts]


class Stage:
    """One epoch's stage file of one partition, open for reading until `drop`."""

    def __init__(self, path: str, name: str, epoch: int, smap: StageMap, nbytes: int) -> None:
        self.path, self.name, self.epoch, self.map, self.nbytes = path, name, epoch, smap, nbytes
        self.users = 0  # views reading it, and builds copying from it (guarded by the store)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise StageError(path, None, f"cannot open the stage file: {e.strerror}") from None

    @property
    def records(self) -> int:
        return self.map.records

    def ended(self, offset: int) -> None:
        raise StageError(self.path, offset, f"stage file of {self.name} (epoch {self.epoch}) ended early: "
                         "changed by something else")

    def verify_read(self, offset: int | None) -> None:
        st = os.fstat(self.fd)
        if st.st_size != self.nbytes or st.st_nlink == 0:
            raise StageError(self.path, offset, f"stage file of {self.name} (epoch {self.epoch}) was "
                             f"removed or changed ({self.nbytes} bytes written, {st.st_size} now)")

    def place(self, index: RecordIndex, ids: np.ndarray, source: Source) -> Runs:
        """Where records ``ids`` (sorted, distinct) lie: in this stage where it holds them, else
        in ``source``."""
        f, c, run = self.map.split(ids)
        inside = run >= 0
        if inside.all():  # a pls view: every record is here (a remote source places nothing)
            return Runs(f, c, np.full(len(f), self.fd, I64), self.map.shift[run])
        out = source.place(index, f[~inside], c[~inside])
        if out is None:
            raise StageError(self.path, None, "records outside the stage from a source without descriptors")
        here = int(inside.sum())
        first = np.concatenate((f[inside], out.first))
        order = np.argsort(first, kind="stable")
        return Runs(first[order], np.concatenate((c[inside], out.count))[order],
                    np.concatenate((np.full(here, self.fd, I64), out.fd))[order],
                    np.concatenate((self.map.shift[run[inside]], out.shift))[order])

    def drop(self) -> None:
        """Close and remove the file (its records are in a newer stage or no longer needed)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class StagedSource:
    """A view's source with its epoch's stage in front: records the stage holds are read from
    it, any other (none, for a pls view) from the shared source."""

    def __init__(self, source: Source, stage: Stage, on_close: Callable[[], None]) -> None:
        self.source, self.stage, self._on_close = source, stage, on_close
        self.origin = source  # where the records lie in their files' order (their neighbours too)
        self.local_fd = stage.fd
        self._closed = False

    def check(self) -> None:
        self.source.check()

    def verify_open(self) -> None:
        self.source.verify_open()

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs:
        """`Stage.place` of the runs' records, `STAGE_RECORDS` at a time (a dense window's runs
        expanded to ids at once took ~50 bytes per record of the window beside its work)."""
        first, count = np.asarray(first, I64), np.asarray(count, I64)
        ends = np.cumsum(count)
        if len(ends) == 0 or ends[-1] <= STAGE_RECORDS:
            return self.stage.place(index, run_ids(first, count), self.source)
        groups = np.searchsorted(ends, np.arange(STAGE_RECORDS, int(ends[-1]), STAGE_RECORDS), side="left") + 1
        edges = np.unique(np.concatenate(([0], groups, [len(first)])))
        parts = [self.stage.place(index, run_ids(first[a:b], count[a:b]), self.source)
                 for a, b in zip(edges[:-1].tolist(), edges[1:].tolist())]
        return Runs(*(np.concatenate([getattr(r, f) for r in parts]) for f in ("first", "count", "fd", "shift")))

    def file_of(self, fd: int) -> Reader:
        return self.stage if fd == self.stage.fd else self.source.file_of(fd)

    def read_range(self, start: int, end: int) -> bytes:
        return self.source.read_range(start, end)

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        raise StageError(self.stage.path, None, "staged views need the compiled gather module")

    def advise(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> None:
        """Nothing: the stage is on local disk, where the kernel's own readahead serves."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.source.close()
            finally:
                self._on_close()


def write_stage(path: str, name: str, epoch: int, index: RecordIndex, ids: np.ndarray, source: Source,
                previous: Stage | None = None, stop: threading.Event | None = None,
                meter: Callable[[int, int], None] | None = None) -> Stage:
    """Write the stage of records ``ids`` (any order; the stage holds them ascending): records
    ``previous`` holds are copied from it, the others read from ``source``.  ``meter`` is told
    ``(source bytes, stage bytes)`` of every chunk; ``stop`` set ends the build between chunks
    (`StageCancelled`).  The file is removed again if anything fails."""
    ids = np.sort(np.asarray(ids))  # in the ids' own dtype: the only O(records) array of a build
    if _repeats(ids):
        ids = np.unique(ids)
    smap = StageMap.of(index.bounds, ids)
    cuts, largest = _chunk_cuts(index, ids)
    out, scratch = np.empty(largest, np.uint8), np.empty(READ_CHUNK, np.uint8)

    def file_of(fd: int) -> Reader:
        return previous if previous is not None and fd == previous.fd else source.file_of(fd)

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StageError(path, None, f"cannot create the stage file: {e.strerror}") from None
    written = 0
    none = np.zeros(0, I64)
    placed = source.place(index, none, none) is not None
    try:
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            if stop is not None and stop.is_set():
                raise StageCancelled(path)
            chunk = ids[a:b]
            take_requests()
            if placed:
                runs = previous.place(index, chunk, source) if previous is not None \
                    else source.place(index, *id_runs(chunk))
                data = build_runs(out, scratch, index, chunk, runs, NO_NEWLINES, file_of)
                nbytes = runs.nbytes(index.bounds)
                local = runs.fd == (previous.fd if previous is not None else -1)
                counts = int(nbytes[~local].sum()), int(nbytes[local].sum())
            else:
                data, counts = _remote_chunk(out, scratch, index, chunk, source, previous)
            _write_all(fd, data, path, written)
            written += len(data)
            if meter is not None:
                meter(*counts, take_requests())
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    try:
        return Stage(path, name, epoch, smap, written)
    except BaseException:
        os.unlink(path)
        raise


def _repeats(ids: np.ndarray) -> bool:
    """Whether sorted ``ids`` hold an id twice (compared `STAGE_RECORDS` at a time)."""
    for lo in range(0, len(ids) - 1, STAGE_RECORDS):
        hi = min(lo + STAGE_RECORDS, len(ids) - 1)
        if (ids[lo + 1: hi + 1] == ids[lo: hi]).any():
            return True
    return False


def _chunk_cuts(index: RecordIndex, ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Steps of a stage build over sorted ``ids``: at most `STAGE_RECORDS` records and about
    `STAGE_CHUNK` bytes each (int64 cuts), and the bytes of the largest step; worked out a step
    at a time (a running byte total of the whole partition took 8 bytes per record)."""
    cuts, largest = [np.zeros(1, I64)], 0
    for lo in range(0, len(ids), STAGE_RECORDS):
        cum = np.cumsum(index.record_lengths(ids[lo: lo + STAGE_RECORDS]))
        inner = cuts_by_bytes(cum, STAGE_CHUNK)
        largest = max(largest, int(np.diff(cum[inner[1:] - 1], prepend=I64(0)).max()))
        cuts.append(inner[1:] + lo)
    return np.concatenate(cuts), largest


def _remote_chunk(out: np.ndarray, scratch: np.ndarray, index: RecordIndex, chunk: np.ndarray, source: Source,
                  previous: Stage | None) -> tuple[np.ndarray, tuple[int, int]]:
    """Records ``chunk`` (ascending) back to back in ``out`` from a source without descriptors
    (object storage): the ones ``previous`` holds copied from it, the rest in one `read_runs`
    (its requests all in flight); returns the bytes and ``(source bytes, stage bytes)``."""
    b = index.bounds
    if previous is not None:
        f, c, run = previous.map.split(chunk)
    else:
        f, c = id_runs(chunk)
        run = np.full(len(f), -1, I64)
    inside = run >= 0
    lengths = b[f + c] - b[f]
    dest = np.cumsum(lengths) - lengths
    far = np.flatnonzero(~inside)
    got = source.read_runs(b[f[far]], b[f[far] + c[far]])
    gather(got, np.cumsum(lengths[far]) - lengths[far], lengths[far], out, dest[far])
    near = np.flatnonzero(inside)
    if len(near):
        runs = Runs(f[near], c[near], np.full(len(near), previous.fd, I64), previous.map.shift[run[near]])
        kept = build_runs(np.empty(int(lengths[near].sum()), np.uint8), scratch, index, run_ids(f[near], c[near]),
                          runs, NO_NEWLINES, lambda fd: previous)
        gather(kept, np.cumsum(lengths[near]) - lengths[near], lengths[near], out, dest[near])
    total = int(lengths.sum())
    return out[:total], (int(lengths[far].sum()), int(lengths[near].sum()))


def _write_all(fd: int, data: np.ndarray, path: str, at: int) -> None:
    mv = memoryview(data)
    pos = 0
    while pos < len(mv):
        try:
            pos += os.write(fd, mv[pos:])
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            raise StageError(path, at + pos, f"cannot write the stage file: {e.strerror}") from None
