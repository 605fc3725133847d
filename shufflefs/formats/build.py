"""Index builds in a worker process, so that a bad source file can never end the daemon.

`scan_file` reads the source through an mmap: if the file is truncated while it is scanned,
touching a vanished page raises SIGBUS and kills the process doing it.  Scans are also long
numpy/Python work that would hold the daemon's GIL while it serves reads.  So the daemon only
loads ready indexes from the on-disk cache itself (``np.load``, no mmap of the source) and sends
every scan to one of a few worker processes.  A worker that dies costs only itself and the scan
it was running: that scan is tried once more in a fresh worker, and if it dies again the open
that needed it gets `StaleSourceError`.

Workers come from a ``forkserver`` (plain fork is unsafe in a multi-threaded trio process), which
preloads numpy and the formats so that starting a worker is a fork, not a fresh interpreter.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Container

from .. import resolve
from ..errors import StaleSourceError
from ..index.table import IndexCache, RecordIndex, SourceStamp, cache_key
from . import Format, scan_file

__all__ = ["IndexBuilder", "default_builder", "interrupt_default", "shutdown_default"]

log = logging.getLogger("shufflefs")

WORKERS = max(1, min(2, os.cpu_count() or 1))
"""Scans running at once (one process each): two let one large file not hold up every other
first open; more would take cores from serving reads."""
PRELOAD = ["shufflefs.formats"]
DIED = "indexing process died (file truncated while being read?)"
STOPPED = "indexing stopped: the filesystem is shutting down"
MANAGER_JOIN = 10.0
"""Seconds a waiting stop gives a stopped pool's manager thread to end (its workers are gone)."""


def _worker_init() -> None:
    # A ^C in the daemon's terminal reaches its whole process group; the daemon unmounts cleanly
    # and stops the workers itself, so they must not die first and fail opens in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent,), name="exit-with-daemon", daemon=True).start()


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    # A pool worker waits on a queue whose write end it holds itself, so it would outlive a
    # daemon killed without a shutdown (SIGKILL, the OOM killer), and keep the forkserver alive.
    parent.join()
    os._exit(0)


class IndexBuilder:
    """Builds indexes like `load_or_build_index`, scanning in lazily started worker processes.

    Each of ``workers`` slots owns a one-process pool and runs one scan at a time, so a worker
    that dies takes no other file's scan with it.  (One pool of several processes would: a death
    breaks the whole pool; and CPython 3.11 can miss the death of a process it started on
    demand while another scan runs, leaving that scan's caller waiting.)

    Thread-safe: `build` blocks and is meant for worker threads.
    """

    def __init__(self, workers: int = WORKERS, start_method: str = "forkserver") -> None:
        if workers < 1:
            raise ValueError("an IndexBuilder needs at least one worker")
        if start_method == "fork":
            raise ValueError("fork is unsafe in a multi-threaded process; use forkserver or spawn")
        self.context = multiprocessing.get_context(start_method)
        self._lock = threading.Lock()
        self._pools: list[ProcessPoolExecutor | None] = [None] * workers
        self._free: queue.LifoQueue[int] = queue.LifoQueue()  # the warmest slot first
        for slot in reversed(range(workers)):
            self._free.put(slot)
        self._generation = 0  # bumped by `shutdown`: scans begun before it end

    def build(self, path: str | os.PathLike, fmt: Format, cache_dir: str | os.PathLike | None = None,
              index_dir: str | os.PathLike | None = None, distrusted: Container[str] = (),
              copy: Any = None) -> RecordIndex:
        """The cached index of ``path`` if its stamp still matches, else one published in
        ``index_dir`` for this version (`shufflefs index --publish --index-dir`; only read; not
        if its cache key is ``distrusted``, found wrong before), else a scan in a worker (then
        cached).

        Raises what the scan raises (`FormatError`, `StaleSourceError`, `OSError`, ...) as it was
        raised in the worker, and `StaleSourceError` if the worker died.  ``copy``: a compressed
        file's `compressed.CopyTarget`, written by a scan (not by a cached index).
        """
        path = os.fspath(path)
        cache = IndexCache(cache_dir)
        stamp = SourceStamp.of(resolve.stat_path(path))
        key = cache_key(path, stamp, fmt.name, fmt.params())
        cached = cache.load(key, stamp)
        if cached is None and index_dir is not None and key not in distrusted:
            cached = IndexCache(index_dir).load(key, stamp)
        if cached is not None:
            return cached
        index = self.scan(path, fmt, copy)
        try:
            cache.store(cache_key(path, index.stamp, fmt.name, fmt.params()), index)
        except OSError as e:
            log.warning("cannot write index cache for %s: %s", path, e)
        return index

    def scan(self, path: str, fmt: Format, copy: Any = None) -> RecordIndex:
        """`scan_file` in a worker process.

        A scan whose worker died is tried once more in a fresh one: the worker may have been
        killed from outside, and a file truncated mid-scan usually scans cleanly the second time.
        """
        generation = self._generation
        slot = self._free.get()
        try:
            for attempt in range(2):
                pool = self._pool(slot, generation, path)
                try:
                    return self._scan_in(slot, pool, path, fmt, copy)
                except BrokenProcessPool:
                    self._discard(slot, pool)
                    if self._generation != generation:
                        raise StaleSourceError(path, None, STOPPED) from None
                    if not attempt:  # the final failure is the caller's to report
                        log.warning("the indexing process for %s died; trying once more in a new one", path)
            raise StaleSourceError(path, None, DIED)
        finally:
            self._free.put(slot)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers now (scans in progress fail); a later `build` starts new ones.

        ``wait=False`` only kills them, without blocking: the scans' callers get their error as
        soon as the pools see their workers gone, and the pools' own threads are joined at exit."""
        with self._lock:
            pools = [p for p in self._pools if p is not None]
            self._pools = [None] * len(self._pools)
            self._generation += 1
        for pool in pools:
            _stop(pool, wait)
        if wait:
            _join_stopped()  # also those of pools stopped without waiting before

    def _pool(self, slot: int, generation: int, path: str) -> ProcessPoolExecutor:
        with self._lock:
            if self._generation != generation:
                raise StaleSourceError(path, None, STOPPED)
            pool = self._pools[slot]
            if pool is None:
                if self.context.get_start_method() == "forkserver":
                    self.context.set_forkserver_preload(PRELOAD)
                pool = self._pools[slot] = ProcessPoolExecutor(1, mp_context=self.context, initializer=_worker_init)
            return pool

    def _scan_in(self, slot: int, pool: ProcessPoolExecutor, path: str, fmt: Format, copy: Any) -> RecordIndex:
        try:
            future: Future = pool.submit(_scan_confined, resolve.roots(), path, fmt, copy)
        except BrokenProcessPool:  # its idle worker died (killed from outside)
            raise
        except RuntimeError:  # `shutdown` stopped it meanwhile
            raise StaleSourceError(path, None, STOPPED) from None
        except OSError as e:  # no process can be started here: scan the old way rather than fail
            self._discard(slot, pool)
            log.error("cannot start an indexing process (%s); scanning %s in the daemon", e, path)
            return scan_file(path, fmt, copy=copy)
        try:
            return future.result()
        except CancelledError:  # `shutdown` dropped it before it started
            raise StaleSourceError(path, None, STOPPED) from None

    def _discard(self, slot: int, pool: ProcessPoolExecutor) -> None:
        """Stop ``pool`` unless `shutdown` already did (the slot's next scan starts a new one)."""
        with self._lock:
            if self._pools[slot] is not pool:
                return
            self._pools[slot] = None
        _stop(pool)


def _scan_confined(roots: list[str], path: str, fmt: Format, copy: Any = None) -> RecordIndex:
    """`scan_file` in a worker, with the daemon's source roots confined there too."""
    for root in roots:
        resolve.confine(root)
    return scan_file(path, fmt, copy=copy)


_unjoined: list[threading.Thread] = []
"""The manager threads of pools stopped without waiting, joined by the next `_stop` that waits."""
_unjoined_lock = threading.Lock()


def _stop(pool: ProcessPoolExecutor, wait: bool = True) -> None:
    # ProcessPoolExecutor would let a running scan finish (minutes for a huge file) before the
    # process may exit; terminate the workers instead.  `_processes` and
    # `_executor_manager_thread` are private but stable (3.8-3.13); without them the shutdown is
    # merely slower.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)  # forgets its manager thread: joined below
    for p in processes:
        try:
            p.terminate()
        except (OSError, ValueError, AttributeError):  # already gone
            pass
    if manager is not None:
        with _unjoined_lock:
            _unjoined.append(manager)
    if wait:
        _join_stopped()


def _join_stopped() -> None:
    """Wait for the manager threads of stopped pools to end.  CPython 3.11's exit hook wakes
    every manager thread still alive without a lock, and may write into the pipe that thread is
    closing at that moment: "Exception ignored ... OSError: [Errno 9] Bad file descriptor" on
    the daemon's stderr, after its last log line."""
    with _unjoined_lock:
        threads, _unjoined[:] = _unjoined[:], []
    for thread in threads:
        thread.join(MANAGER_JOIN)
        if thread.is_alive():
            log.warning("an indexing pool's manager thread did not end within %g s", MANAGER_JOIN)


_default: IndexBuilder | None = None
_default_lock = threading.Lock()


def default_builder() -> IndexBuilder:
    """The process's shared builder (created on first use; its pool starts with the first scan)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = IndexBuilder()
        return _default


def interrupt_default() -> None:
    """End the shared builder's scans in progress now, without blocking (on a signal, from the
    event loop: an open waiting on a scan must end before the FUSE loop can, which otherwise
    waited for a scan of a large file until the exit watchdog cut the process short)."""
    with _default_lock:
        builder = _default
    if builder is not None:
        builder.shutdown(wait=False)


def shutdown_default() -> None:
    """Stop the shared builder's workers, if it ever started any; the daemon calls this at exit."""
    global _default
    with _default_lock:
        builder, _default = _default, None
    if builder is not None:
        builder.shutdown()
