"""Temporary files of a daemon, kept where the daemon can find and remove them after a crash.

Index cache entries are written to temporary files first (``<pid>-*.tmp`` beside the entry) and
the indexing workers' multiprocessing machinery makes a ``pymp-*`` folder in the temporary
directory.  A daemon killed with SIGKILL cleans neither, so every daemon keeps its temporaries
in ``$TMPDIR/shufflefs-<pid>/`` (short: the forkserver's socket path must fit in 108 bytes) and
removes, at start, what dead daemons left there and in the cache (a temporary whose pid no
longer runs).  Live daemons keep theirs.

Directories a daemon keeps elsewhere (its stages under ``--stage-dir``, large) are `held`: the
daemon holds a lock (``flock``) on the directory until it exits, whatever way it ends, so the next
daemon using the same place removes the ones no process holds (`remove_unheld`).  A lock, not a
pid: a pid may run again as another process; the lock goes with the last descriptor.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from .config import cache_unwritable

try:  # compiled at install time; optional
    from ._gather import cached_pages as _cached_pages
except ImportError:  # pragma: no cover - depends on the build
    _cached_pages = None

log = logging.getLogger("shufflefs")

RUN_PREFIX = "shufflefs-"
TMP_NAME = re.compile(r"^(\d+)-.*\.tmp$")


def pwrite_all(fd: int, data: object, offset: int) -> None:
    """All of ``data`` (a buffer) written at ``offset`` of ``fd`` (a daemon's copy or stage file):
    a short write goes on where it stopped, one that writes nothing is EIO."""
    view = memoryview(data).cast("B")  # type: ignore[arg-type]
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"short write at byte {offset}")
        view, offset = view[n:], offset + n


READ_AHEAD = 4 << 20
"""Bytes asked into the page cache at a time (`read_ahead`): the kernel reads at most its
read-ahead size of a larger request.  Measured on a 1.13 GiB decoded copy, the page cache
dropped, rows gathered in random order: 0.47-0.58 s with it, 0.86-0.96 s without, 0.90-1.03 s
with one request for the whole file."""


def read_ahead(fd: int, size: int, tail: int = 0, ranges: list[tuple[int, int]] | None = None,
               settle: bool = False) -> None:
    """Ask the kernel for the first ``size`` bytes of ``fd`` (or bytes ``[lo, hi)`` of each of
    ``ranges``), front to back, `READ_AHEAD` at a time (a thread of its own: each request waits
    while its reads are submitted; pages already cached cost about 17 ms per GiB), after its last
    ``tail`` bytes (a Parquet file's footer, which its readers read first); closes ``fd``, its
    own descriptor.  ``settle``: then waits for each `READ_AHEAD` asked for to be read (a byte of
    each, in order: the asks return once the reads are queued)."""
    ends: list[int] = []  # of each request
    try:
        if tail:
            os.posix_fadvise(fd, max(0, os.fstat(fd).st_size - tail), tail, os.POSIX_FADV_WILLNEED)
        for lo, hi in [(0, size)] if ranges is None else ranges:
            for offset in range(lo, hi, READ_AHEAD):
                os.posix_fadvise(fd, offset, min(READ_AHEAD, hi - offset), os.POSIX_FADV_WILLNEED)
                ends.append(min(offset + READ_AHEAD, hi))
        for end in ends if settle else ():
            os.pread(fd, 1, end - 1)
    except OSError:
        pass  # a hint only
    finally:
        os.close(fd)


def read_ahead_in_thread(fd: int, size: int, name: str, tail: int = 0, mapping: object = None,
                         settle: bool = False) -> threading.Thread:
    """`read_ahead` of a duplicate of ``fd`` in a new daemon thread (started; ``fd`` stays the
    caller's); given the file's ``mapping``, nothing is asked when all its pages are cached
    (`cachestat`: 0.04 ms for a cached GiB, where the hints over a cached 1.06 GiB file took 17
    ms of CPU beside its reader).  ``settle``: the thread ends only once what it asked for is
    read (the asks return as soon as the reads are queued: 0.17 s for a 1.05 GiB file read in
    0.91 s), so that it is alive while the reads are.  Raises OSError if ``fd`` cannot be
    duplicated."""
    thread = threading.Thread(target=_read_ahead_uncached, args=(os.dup(fd), size, tail, mapping, settle),
                              name=name, daemon=True)
    thread.start()
    return thread


def read_ranges_ahead_in_thread(fd: int, ranges: list[tuple[int, int]], name: str) -> threading.Thread:
    """`read_ahead` of bytes ``[lo, hi)`` of each range of a duplicate of ``fd`` in a new daemon
    thread (started; ``fd`` stays the caller's)."""
    thread = threading.Thread(target=read_ahead, args=(os.dup(fd), 0, 0, ranges), name=name, daemon=True)
    thread.start()
    return thread


def _read_ahead_uncached(fd: int, size: int, tail: int, mapping: object, settle: bool = False) -> None:
    try:
        if mapping is not None and _all_cached(fd, mapping):
            os.close(fd)
            return
    except OSError:
        pass
    read_ahead(fd, size, tail, settle=settle)


def _all_cached(fd: int, mapping: object) -> bool:
    if _cached_pages is None:  # pragma: no cover - depends on the build
        return False
    n = len(memoryview(mapping))  # type: ignore[arg-type]
    return bool(n) and _cached_pages(fd, mapping) * mmap.PAGESIZE >= n


def cached_share(fd: int, mapping: object, start: int, end: int) -> float:
    """The share of bytes ``[start, end)`` of the mapped file ``fd`` in the page cache (1.0 when
    it cannot be told: the callers then take the cached path)."""
    if _cached_pages is None or end <= start:  # pragma: no cover - depends on the build
        return 1.0
    a = start // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        pages = _cached_pages(fd, memoryview(mapping)[a:end], a)  # type: ignore[arg-type]
    except (OSError, ValueError):
        return 1.0
    return min(1.0, pages * mmap.PAGESIZE / max(end - a, 1))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_dir(pid: int | None = None) -> Path:
    """The temporary directory of the daemon ``pid`` (this one by default)."""
    return Path(tempfile.gettempdir()) / f"{RUN_PREFIX}{os.getpid() if pid is None else pid}"


def remove_stale(cache_dir: Path) -> int:
    """Remove what dead daemons left in the temporary directory and in ``cache_dir``; returns the
    number of entries removed."""
    removed = 0
    try:
        for d in Path(tempfile.gettempdir()).iterdir():
            pid = d.name[len(RUN_PREFIX):]
            if d.name.startswith(RUN_PREFIX) and pid.isdigit() and not _alive(int(pid)) and d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
    except OSError:
        pass
    try:
        for sub in cache_dir.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                m = TMP_NAME.match(f.name)
                if m and not _alive(int(m.group(1))):
                    f.unlink(missing_ok=True)
                    removed += 1
    except OSError:
        pass
    if removed:
        log.info("removed %d temporaries that stopped daemons left in %s", removed, cache_dir)
    return removed


def claim(cache_dir: Path) -> Path | None:
    """This daemon's temporary directory (also ``tempfile``'s and its children's), after removing
    stale ones; None (the system's default stays) if it cannot be made."""
    remove_stale(cache_dir)
    own = run_dir()
    try:
        own.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("temporaries stay in %s: cannot make %s: %s", tempfile.gettempdir(), own, e)
        return None
    tempfile.tempdir = str(own)
    os.environ["TMPDIR"] = str(own)
    return own


def index_cache(cache_dir: Path, own: Path | None) -> tuple[Path, str | None]:
    """Where this daemon writes indexes, and a warning (logged once) if not in ``cache_dir``.

    A cache directory that cannot be written (a read-only file system, say) is still read: its
    entries are linked into ``own/index-cache``, where new indexes are written, to go with the
    rest of ``own`` at exit.  So a mount still starts, every index build does not log its own
    failed write, and an index let go from memory is read back rather than scanned again."""
    why = cache_unwritable(cache_dir)
    if why is None:
        return cache_dir, None
    if own is None:
        warning = f"cache directory {cache_dir} cannot be written ({why}): indexes are not kept on disk"
        log.warning("%s", warning)
        return cache_dir, warning
    private = own / "index-cache"
    linked = 0
    try:
        private.mkdir(exist_ok=True)
        for sub in os.scandir(cache_dir):
            if len(sub.name) == 2 and sub.is_dir(follow_symlinks=False):
                (private / sub.name).mkdir(exist_ok=True)
                for entry in os.scandir(sub.path):
                    if entry.name.endswith(".npz"):
                        os.symlink(entry.path, private / sub.name / entry.name)
                        linked += 1
    except OSError as e:
        log.debug("linked %d entries of %s, then: %s", linked, cache_dir, e)
    warning = (f"cache directory {cache_dir} cannot be written ({why}): its {linked} indexes are used, new "
               f"ones are kept in {private} until this mount ends")
    log.warning("%s", warning)
    return private, warning


def release(own: Path | None) -> None:
    """Remove ``own`` once multiprocessing has removed its own folder in it (its finalizers run
    at exit, by priority: the temporary directory's at -100, this at -200)."""
    if own is not None:
        from multiprocessing import util

        util.Finalize(None, shutil.rmtree, args=(own,), kwargs={"ignore_errors": True}, exitpriority=-200)


def held(root: str | os.PathLike, prefix: str) -> tuple[str, int]:
    """A new directory ``root/<prefix><pid>-XXXXXXXX`` and the descriptor that holds its lock
    (close it after removing the directory), after removing the directories of that prefix that
    no process holds.  It is made under a hidden name and renamed once locked, so that no other
    daemon can see it unlocked."""
    remove_unheld(root, prefix)
    made = tempfile.mkdtemp(prefix=f".{prefix}{os.getpid()}-", dir=root)
    fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:  # a filesystem without locks: the directory goes at unmount only
        log.warning("cannot lock %s (%s): if this daemon is killed, remove it by hand", made, e)
    path = os.path.join(os.fspath(root), os.path.basename(made)[1:])
    try:
        os.rename(made, path)
    except BaseException:
        os.close(fd)
        shutil.rmtree(made, ignore_errors=True)
        raise
    return path, fd


def remove_unheld(root: str | os.PathLike, prefix: str) -> int:
    """Remove the directories ``root/<prefix>*`` of this user that no process holds (their
    daemons died: SIGKILL, the OOM killer, a crash), and hidden ones a dead daemon was making;
    returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        hidden = entry.name.startswith("." + prefix)
        pid, dash, _ = entry.name[len(prefix) + hidden:].partition("-")
        if not (entry.name.startswith(prefix) or hidden) or not (pid.isdigit() and dash):
            continue  # not one of these (or of a version that held no lock: its daemon may run)
        if hidden:  # made, not locked yet: judged by its pid
            gone = not _alive(int(pid)) and _own_dir(entry.path)
            if gone:
                shutil.rmtree(entry.path, ignore_errors=True)
        else:
            gone = _remove_if_unheld(entry.path)
        if gone:
            removed += 1
            log.info("removed %s, left by a daemon that is gone", entry.path)
    return removed


def _own_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _remove_if_unheld(path: str) -> bool:
    if not _own_dir(path):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live daemon (or locks unsupported here: keep it)
        os.close(fd)
        return False
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)
    return not os.path.lexists(path)
