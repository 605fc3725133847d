"""A Parquet view's whole bytes for one epoch, written once into a file on local disk.

Served window by window, a Parquet view is encoded in pieces as readers ask: pyarrow hints every
column chunk it will read and the kernel asks for the start of each long before the reader gets
there, so windows are encoded, dropped and encoded again (docs/benchmark.md, Parquet views).
Where the kernel can read a file for the mount itself (FUSE passthrough, `serve.passthrough`),
the view is instead encoded front to back, once, into a *stage file*, and every handle of the
view reads that file at the speed of the local disk: no request reaches the daemon.

The file is made without a name (``O_TMPFILE``; else named and unlinked at once), so it goes
with its last descriptor, even after a kill; a stage that closes gives its file to the next, and
at unmount the free files are left for the next mount (`StageFiles.spares`), whose first stages
are then written into blocks and pages that exist already.  Blocking (a worker thread), no FUSE.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import tempfile
import threading
import time
from typing import Any

import numpy as np

from ..errors import StageError
from ..formats.base import FramingError
from .. import scratch
from ..scratch import pwrite_all
from . import parquet_scatter
from .kept_copies import fit

__all__ = ["kept_stage", "write_stage", "ParquetStage", "StageFiles", "StageWriter"]

log = logging.getLogger("shufflefs")

AHEAD_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

class StageFile:
    """An unnamed file on local disk and a read-only mapping of it, ``capacity`` bytes (at least
    the file's size), which the daemon answers the reads that reach it from.  A stage is written
    with ``pwrite``: encoded into the mapping instead, its pages were made writable again by a
    fault each once the kernel had written them back (the stages of an epoch or two are more
    than the dirty bytes the kernel lets wait on a machine of 23 GB), measured 0.2-0.4 CPU-s
    more per 1 GiB stage."""

    def __init__(self, directory: str, fd: int = -1, path: str | None = None) -> None:
        """A new nameless file in ``directory``, or the spare file ``fd`` at ``path`` (`StageFiles`)."""
        self.fd = fd if fd >= 0 else _anonymous_file(directory)
        self.path = path
        self.capacity = 0
        self.size = os.fstat(self.fd).st_size if fd >= 0 else 0  # the last stage's (`StageFiles.take`)
        self.map: mmap.mmap | None = None
        self.key: str | None = None
        """The stage it holds whole (`stage_keys`), set once that stage is written; None while it
        is written, or holds no stage known to be whole."""

    def resize(self, size: int) -> np.ndarray:
        """The file cut or grown to ``size`` bytes; its mapping as an array (made larger first if
        need be: a mapping may reach past the end of the file, never touched there)."""
        if size > self.capacity:
            self._unmap()
            capacity = (size + (8 << 20)) & ~(mmap.PAGESIZE - 1)
            os.ftruncate(self.fd, capacity)
            self.map = mmap.mmap(self.fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ)
            self.capacity = capacity
        os.ftruncate(self.fd, size)
        self.size = size
        return np.frombuffer(self.map, np.uint8, count=size) if size else np.zeros(0, np.uint8)  # type: ignore[arg-type]

    def close(self) -> None:
        self._unmap()
        os.close(self.fd)
        self.fd = -1
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _unmap(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # an array over it is still referenced: unmapped when it goes
                pass
            self.map = None


class ParquetStage:
    """A view's stage: its file, its bytes (an array over the file's mapping: what the daemon
    answers the few reads that still reach it from, `serve.passthrough`) and, once the mount
    registered it with the kernel, its backing id.  ``close`` lets the id go and gives the file
    back to its `StageFiles` for the next stage (no handle reads it any more: the view closes
    only then)."""

    def __init__(self, file: StageFile, data: np.ndarray, seconds: float, files: "StageFiles | None" = None,
                 tail: int = 0) -> None:
        """``tail``: the bytes of its footer (read first by readers, and so read ahead first)."""
        self.file, self.data, self.seconds, self.files, self.tail = file, data, seconds, files, tail
        self.fd, self.size = file.fd, len(data)
        self.backing_id = 0
        self.release_id: Any = None  # called with the id when the stage closes
        self.made = ""  # when: at its first open, when its epoch was set, while the epoch (or file) before was read
        self.scattered = False  # its largest column read from a copy on disk around the page cache (`parquet_scatter`)
        self.kept = ""  # where it was written, if a file held it whole already (`kept_stage`)
        self._ahead: threading.Thread | None = None

    def read_ahead(self) -> None:
        """Ask the kernel for the stage's pages front to back, in a thread (one at a time), as a
        handle of it opens, unless they are all cached: the kernel reads a stage for its readers
        with its own read-ahead, which pyarrow's reads from several threads keep small.  A 1.06
        GiB view read cold by ``iter_batches`` took 0.49-1.10 s with it, 0.70-2.00 without
        (alternated, as a regular file).  At most a quarter of the machine's memory ahead: the
        rest comes as the reader gets there."""
        if self.fd < 0 or (self._ahead is not None and self._ahead.is_alive()):
            return
        try:
            self._ahead = scratch.read_ahead_in_thread(self.fd, min(self.size, AHEAD_MEMORY // 4), "stage-ahead",
                                                       self.tail, self.data, settle=True)
        except OSError:
            pass  # a hint only

    @property
    def reading_ahead(self) -> bool:
        """Whether its pages are on their way from disk for its readers (`read_ahead`), until
        the last one asked for is read."""
        return self._ahead is not None and self._ahead.is_alive()

    def pread(self, size: int, offset: int) -> bytes:
        return bytes(self.data[offset: offset + size])

    def close(self) -> None:
        if self.backing_id and self.release_id is not None:
            try:
                self.release_id(self.backing_id)
            except OSError:
                pass
            self.backing_id = 0
        self.data = np.zeros(0, np.uint8)
        if self.fd >= 0:
            self.fd = -1
            if self.files is not None:
                self.files.give_back(self.file)
            else:
                self.file.close()


class StageFiles:
    """Stage files in one directory, kept for the next stages: writing a stage into a file whose
    pages are still in the page cache copies into them, where a new file's first writes also
    allocate and zero every page (measured on a 1 GiB view, in one process: 0.70 CPU-s a stage
    written into a kept file, 1.8 into a new one; on the machine of 2026-11-30, 0.40 s and 2.8 s,
    whose VM made new page-cache pages costly).  As many files wait for reuse as were ever in
    use at once, and at least `KEPT` (a past epoch's, the current one's and the next one's are in
    use while a reader moves on); the others are closed, and so freed.  At unmount the free ones are named among the kept copies
    for the next mount (`kept_copies.KeptCopies.keep_spare`), which takes them when it has none
    free: the first epoch of a later mount read 1.03-1.05 s with them, 1.35-1.67 s without
    (1.02 GiB file, warm, in alternated runs).  Shards read in turn use more at once (an
    epoch's four views, and the next epoch's first stage built ahead): with three kept, each
    epoch of four 270 MiB shards closed one file and made a new one, whose stage's writes cost
    0.15-0.22 CPU-s against 0.03."""

    KEPT = 3
    BUFFERS = 2
    CLOSE_WAIT = 2.0
    """Seconds `close` waits for the files of builds still running (stopped by the unmount at
    their next window) to come back.  A later mount read its first epoch with one spare, where
    the next epoch's stage, built beside that read, went into a new file, still unwritten when a
    one-epoch job unmounted: so the next mount found one spare again."""

    def __init__(self, directory: str, spares: Any = None) -> None:
        """``spares``: where files are left for the next mount at `close`, and taken from when
        none is free (a `kept_copies.KeptCopies`; None: never)."""
        self.directory, self.spares = directory, spares
        self._free: list[StageFile] = []
        self._buffers: list[np.ndarray] = []  # `borrow`
        self._lock = threading.Condition()
        self._out = 0  # files taken and not given back (`close` waits for them)
        self._names = 0
        self._closed = False
        self.made = self.closed = self.reused = self.kept = 0
        self.most_used = 0  # the most files in use at once: as many wait for reuse (at least `KEPT`)

    def take(self, size: int = 0) -> StageFile:
        """A file for a stage of ``size`` bytes: of the free ones about that large or larger
        (holding no whole stage first) the one given back last, else the largest
        (`kept_copies.fit`, as for spares)."""
        with self._lock:
            self._lent()
            if self._free:
                pick = max(range(len(self._free)),
                           key=lambda i: fit(self._free[i].size, size, i, self._free[i].key is not None))
                file = self._free.pop(pick)
                file.key = None  # rewritten from now on
                return file
            self.made += 1
            path = self._name("stage-spare")
        if self.spares is not None:
            fd = self.spares.take_spare(path, size)
            if fd is not None:
                with self._lock:
                    self.reused += 1
                return StageFile(self.directory, fd, path)
        return StageFile(self.directory)

    def take_kept(self, key: str | None, size: int) -> tuple[StageFile, str] | None:
        """A file that holds the stage known by ``key`` whole, ``size`` bytes (`stage_keys`), and
        where it was written: one given back in this mount, else one an earlier mount left
        (`kept_copies.KeptCopies.take_stage`); None if there is none.  Given back as any taken
        file."""
        if key is None:
            return None
        with self._lock:
            for i, file in enumerate(self._free):
                if file.key == key and file.size == size:
                    self._lent(kept=True)
                    return self._free.pop(i), "earlier in this mount"
            path = self._name("stage-kept")
        fd = None if self.spares is None else self.spares.take_stage(path, key, size)
        if fd is None:
            return None
        with self._lock:
            self._lent(kept=True)
            self.made += 1
        file = StageFile(self.directory, fd, path)
        file.key = key
        return file, "by an earlier mount"

    def _lent(self, kept: bool = False) -> None:
        """One file more in use (under the lock)."""
        self._out += 1
        self.most_used = max(self.most_used, self._out)
        self.kept += kept

    def _name(self, what: str) -> str:
        """A name in the directory no other file of this mount has (under the lock)."""
        self._names += 1
        return os.path.join(self.directory, f"{what}-{os.getpid()}-{self._names}")

    def borrow(self) -> np.ndarray | None:
        """A buffer a stage build encoded its windows in before (None: the first build's own).
        Arrays from 1 MiB on are mapped afresh at each allocation (`heap.MMAP_THRESHOLD`): a new
        buffer for each build faulted in and zeroed a window's worth of pages, 2,048 faults a
        build; shards read in turn build four stages an epoch, often on two threads each."""
        with self._lock:
            return self._buffers.pop() if self._buffers else None

    def lend_back(self, buffer: np.ndarray | None) -> None:
        """Keep ``buffer`` for the next build: at most `BUFFERS` (one per thread of a build)."""
        with self._lock:
            if buffer is not None and len(self._buffers) < self.BUFFERS:
                self._buffers.append(buffer)

    def give_back(self, file: StageFile, reuse: bool = True) -> None:
        """A taken file back, kept for the next stage (not after `close`; not ``reuse``: a failed
        stage's that goes with its readers, `StageWriter.shared`) or closed."""
        with self._lock:
            self._out -= 1
            self._lock.notify_all()
            if reuse and not self._closed and len(self._free) < max(self.KEPT, self.most_used):
                self._free.append(file)
                return
            self.closed += 1
        file.close()

    def close(self) -> None:
        """At unmount: the free files left for the next mount (`spares`), else closed; once the
        builds still running gave theirs back (at most `CLOSE_WAIT`).  A file given back later
        is closed."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._out <= 0, self.CLOSE_WAIT):
                log.info("%d stage file(s) still being written after %g s: closed, not left for the next mount",
                         self._out, self.CLOSE_WAIT)
            self._closed = True
            free, self._free = sorted(self._free, key=lambda f: -f.size), []
        for file in free:  # the largest first: a spare serves any stage up to its size
            if self.spares is not None:
                if self.spares.keep_spare(file.fd, file.path, file.key):
                    file.path = None  # its name is the spare's now
            file.close()


def _anonymous_file(directory: str) -> int:
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    fd, path = tempfile.mkstemp(prefix="stage-", dir=directory)
    os.unlink(path)
    return fd


class StageWriter:
    """One stage being written (`write_stage`): windows are taken one at a time from a shared
    counter by every thread that calls `work`, so a build started by one thread (the next epoch's,
    beside the readers) takes another that comes to help (an open waiting for it).  Consecutive
    windows fall in few plan windows, whose rows `ParquetView.rows` keeps."""

    def __init__(self, view: Any, files: StageFiles, key: str | None = None) -> None:
        """``key``: what the file holds once the stage is written (`stage_keys`)."""
        lay = view.layout
        starts = np.asarray(lay.window_starts, np.int64)
        if (starts[0] if len(starts) else lay.trailer_offset) != len(view.header) or (
                int(lay.trailer_offset) + len(view.trailer) != lay.size) or (
                len(starts) and starts[-1] != lay.trailer_offset):
            raise FramingError(view.path, None, "its windows do not cover the view between header and footer")
        self.view, self.files, self.key, self.t0 = view, files, key, time.monotonic()
        self.skip = -1 if (leaf := parquet_scatter.deferred_leaf(view)) is None else leaf
        """A leaf whose values the windows leave out: read around the page cache, they are put in
        place once every window is written (`parquet_scatter`, at `finish`), and only then are
        the windows done.  Known before the view names its writer: an open may ask for
        `early_reads` from then on."""
        self.file = files.take(lay.size)
        self._next, self._active = 0, 0
        n = lay.n_windows
        self._order = np.concatenate([np.arange(n - 1, n), np.arange(n - 1)]) if n else np.zeros(0, np.int64)
        """The last window first, after the footer: readers read the file's last 64 KiB first."""
        self._done = np.zeros(n, bool)
        self.prefix = 0
        """Windows written from the first on: bytes up to `written_end` may be read already."""
        self.failed: list[BaseException] = []
        self.shared = False
        """Whether handles read the file as it is written (`serve.early_opens`): if the stage
        fails, its file then goes with them, never to another stage."""
        self._cond = threading.Condition()
        try:
            self.data = self.file.resize(lay.size)
            pwrite_all(self.file.fd, memoryview(view.header), 0)
            pwrite_all(self.file.fd, memoryview(view.trailer), int(lay.trailer_offset))  # read first by readers
        except BaseException:
            self.data = np.zeros(0, np.uint8)
            files.give_back(self.file)
            raise
        view.writer = self  # its loads are the stage's (`ParquetView.rows`); others may help (`work`)
        if self.skip >= 0:
            copy = view.copy
            a = int(copy.layout.values[leaf])
            copy.read_ahead([(0, a), (a + int(copy.layout.group_values[-1, leaf]), int(copy.layout.size))])

    def work(self) -> None:
        """Encode windows not taken yet until none is left (or one failed: it is kept)."""
        view, n = self.view, self.view.layout.n_windows
        with self._cond:
            self._active += 1
        starts = view.layout.window_starts
        buf = self.files.borrow()
        try:
            while True:
                with self._cond:
                    if self.failed or self._next >= n:
                        return
                    k, self._next = int(self._order[self._next]), self._next + 1
                if view.copy.stop.is_set():  # the mount is stopping (`RowCopies.stop`)
                    raise StageError(view.path, None, "the mount is stopping: its stage was left unwritten")
                size = view.layout.window_size(k)
                if buf is None or len(buf) < size:  # with room for the next views' windows
                    buf = np.empty(size + size // 8, np.uint8)
                data, _ = view.load_window(k, out=buf, skip=self.skip)
                pwrite_all(self.file.fd, memoryview(data), int(starts[k]))
                if self.skip >= 0:
                    continue
                with self._cond:
                    self._done[k] = True
                    while self.prefix < n and self._done[self.prefix]:
                        self.prefix += 1
        except BaseException as e:  # noqa: BLE001 - raised by `finish`
            with self._cond:
                self.failed.append(e)
        finally:
            self.files.lend_back(buf)
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @property
    def early_reads(self) -> bool:
        """Whether its windows can be read as they are written: not those of a stage whose
        values are put in place at the end (`skip`), so an open waits for that stage whole and
        is passed through, rather than served by the daemon for its whole epoch."""
        return self.skip < 0

    @property
    def written_end(self) -> int:
        """The end of the bytes written from the start (header and whole windows); the footer is
        written first, at its place."""
        lay = self.view.layout
        return int(lay.window_starts[self.prefix]) if self.prefix < lay.n_windows else int(lay.trailer_offset)

    def written(self, off: int, end: int) -> bool:
        """Whether the view's bytes [off, end) are in the file already."""
        lay = self.view.layout
        trailer = int(lay.trailer_offset)
        if min(end, trailer) <= self.written_end or off >= trailer:
            return True
        starts = lay.window_starts
        first = max(int(np.searchsorted(starts, off, "right")) - 1, 0)
        last = int(np.searchsorted(starts, min(end, trailer), "left"))
        return bool(self._done[first:last].all())

    def finish(self) -> ParquetStage:
        """Once the caller's `work` returned: wait for the helpers, check what was written."""
        with self._cond:
            while self._active:
                self._cond.wait()
        if self.skip >= 0 and not self.failed:
            try:
                self._scatter()
            except BaseException as e:  # noqa: BLE001 - raised below
                self.failed.append(e)
            else:
                with self._cond:
                    self._done[:] = True
                    self.prefix = len(self._done)
                self.view.copy.warm()  # the next epochs' stages gather from it (built while this one is read)
        data, self.data = self.data, np.zeros(0, np.uint8)
        self.view.drop_order()
        self.view.writer = None
        try:
            if self.failed:
                raise self.failed[0]
            lay = self.view.layout
            size = os.fstat(self.file.fd).st_size
            if size != lay.size:
                raise FramingError(self.view.path, None, f"stage of {size} bytes, planned {lay.size}")
        except BaseException as e:
            with self._cond:
                if not self.failed:
                    self.failed.append(e)
            self.files.give_back(self.file, reuse=not self.shared)
            raise
        self.file.key = self.key
        stage = ParquetStage(self.file, data, time.monotonic() - self.t0, self.files, len(self.view.trailer))
        stage.scattered = self.skip >= 0
        return stage

    def _scatter(self) -> None:
        """Put the values the windows left out in place (`parquet_scatter`), through a writable
        mapping of the file, whose pages the windows' writes made (pages made by faults on the
        mapping instead were read back 0.9-3.4 s slower an epoch, in system time)."""
        view = self.view
        places = np.full(view.copy.layout.sizes.n_rows, -1, np.int64)
        for k in range(view.layout.n_windows):
            rows, at = view.value_places(k, self.skip)
            places[rows] = at
        parquet_scatter.Scatter(view, self.skip, places, self.file.fd, view.layout.size, view.copy.stop).run()


def kept_stage(view: Any, files: StageFiles, key: str | None) -> ParquetStage | None:
    """The stage of ``view`` as a file of ``files`` holds it already (`StageFiles.take_kept`), or
    None: none does."""
    t0 = time.monotonic()
    got = files.take_kept(key, view.layout.size)
    if got is None:
        return None
    file, origin = got
    try:
        data = file.resize(view.layout.size)
    except BaseException:
        files.give_back(file, reuse=False)
        raise
    stage = ParquetStage(file, data, time.monotonic() - t0, files, len(view.trailer))
    stage.kept = origin
    return stage


def write_stage(view: Any, files: StageFiles, threads: int = 2, key: str | None = None) -> ParquetStage:
    """Encode every byte of the Parquet view ``view`` (a `stages.parquet_view.ParquetView`) into a
    file of ``files`` with ``threads`` threads (others may `StageWriter.work` on ``view.writer``
    meanwhile), known by ``key`` once written (`stage_keys`).  Raises what a window load raises
    (a changed source, a damaged copy); the file then goes back."""
    writer = StageWriter(view, files, key)
    helpers = [threading.Thread(target=writer.work, name="stage") for _ in range(threads - 1)]
    for h in helpers:
        h.start()
    writer.work()
    for h in helpers:
        h.join()
    return writer.finish()
