"""Mount lifecycle: checks, logging, the trio loop, signals, and an unmount that always happens.

`run` mounts in the calling process and returns when the filesystem is unmounted: by
``fusermount3 -u``, by SIGINT/SIGTERM, or by an error.  It reports readiness on ``ready_fd``
(``b"ready\\n"``, then the descriptor is closed) so that a launcher that forked it can return once
the mount is usable.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pyfuse3
import trio

from .. import scratch
from ..windows import heap
from ..config import MountConfig, check_paths
from ..errors import ShuffleError
from ..formats import build as indexer
from ..sources import scheme_of
from . import control
from .fuse_ops import VIEW_BLKSIZE, ShuffleFS

log = logging.getLogger("shufflefs")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LEVELS = {0: logging.WARNING, 1: logging.INFO}


_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(32), 127] if c != 9} | {10: "\\n", 13: "\\r"}


class LineFormatter(logging.Formatter):
    """One message, one line: a message that names a file holding a newline or a terminal escape
    (any byte may be in a name) would otherwise start a line that reads as a record of its own, or
    drive the terminal it is read on.  Control characters in the message are written escaped;
    a traceback after it keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)


def setup_logging(log_file: str | os.PathLike | None, verbosity: int) -> logging.Handler:
    """Send the ``shufflefs`` (and ``pyfuse3``) loggers to ``log_file`` or stderr."""
    handler: logging.Handler
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"))
    level = LEVELS.get(verbosity, logging.DEBUG)
    for name, lvl in (("shufflefs", level), ("pyfuse3", max(level, logging.INFO))):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(lvl)
    return handler


def _remove_logging(handler: logging.Handler) -> None:
    for name in ("shufflefs", "pyfuse3"):
        logging.getLogger(name).removeHandler(handler)
    handler.close()


def _fsname(source: str) -> str:
    """``fsname=shufflefs:<src>``: libfuse splits options at commas (escaped with a backslash)."""
    name = "shufflefs:" + source
    if not name.isascii():
        name = "shufflefs"
    return "fsname=" + name.replace("\\", "\\\\").replace(",", "\\,")


def is_mounted(mountpoint: str | os.PathLike) -> bool:
    """Whether ``mountpoint`` is mounted (from /proc/mounts, without touching the path itself)."""
    return control.mount_type(os.path.abspath(mountpoint)) is not None


class _Ready:
    """The launcher's pipe: written once, closed exactly once."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def signal(self) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, b"ready\n")
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


async def _main(fs: ShuffleFS, mnt: str, ready: _Ready) -> None:
    async with trio.open_nursery() as nursery:
        fs.start(nursery)
        if threading.current_thread() is threading.main_thread():
            nursery.start_soon(_watch_signals, mnt, fs)

        async def settle() -> None:
            """Readiness once the readahead is set: until then this daemon's own stat of the
            mount point is in flight, and an unmount at that moment failed with EBUSY."""
            try:
                await trio.to_thread.run_sync(raise_readahead, mnt, abandon_on_cancel=True)
            finally:
                ready.signal()
            fs.mounted()

        nursery.start_soon(settle)
        try:
            await pyfuse3.main()
        finally:
            fs.stopping()
            nursery.cancel_scope.cancel()


MNT_DETACH = 2
EXIT_GRACE = 5.0
"""Seconds a signalled daemon may take to unmount cleanly before the watchdog detaches the
mount and ends the process (a worker thread stuck on a hung source must not keep it alive)."""


async def _watch_signals(mnt: str, fs: ShuffleFS) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("%s received: unmounting", signal.Signals(signum).name)
            threading.Thread(target=_watchdog, args=(mnt, EXIT_GRACE), name="exit-watchdog", daemon=True).start()
            # the FUSE loop ends only once every request has: opens waiting on an index scan or
            # a stage build must fail now, not when a scan of a large file ends (the watchdog's
            # exit then skipped every cleanup, leaving the temporaries and the semaphores)
            fs.stopping()
            indexer.interrupt_default()
            pyfuse3.terminate()
            return


def _watchdog(mnt: str, grace: float) -> None:
    """Last resort after a signal: if the process still runs ``grace`` seconds later, detach the
    mount and exit at once (threads stuck in reads of a hung source cannot be interrupted)."""
    time.sleep(grace)
    log.error("still running %.0f s after the signal (work stuck on the source?): detaching %s and exiting",
              grace, mnt)
    # no child process: forking can itself hang next to threads stuck on the source
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(mnt), MNT_DETACH) != 0:
        log.error("cannot detach %s (%s): run 'shufflefs umount %s'", mnt, os.strerror(ctypes.get_errno()), mnt)
    control.remove_pid_file(control.pid_file(mnt))  # only if it names this process
    logging.shutdown()
    os._exit(EXIT_FAILED)


def run(config: MountConfig, ready_fd: int | None = None, log_file: str | os.PathLike | None = None,
        verbosity: int = 0) -> int:
    """Mount ``config.source`` at ``config.mountpoint`` and serve until unmounted.

    Returns 0 after a clean unmount, 2 for unusable paths, 1 if mounting or serving failed.
    """
    ready = _Ready(ready_fd)
    handler = setup_logging(log_file, verbosity)
    try:
        problem = check_paths(config)
        if problem:
            log.error("%s", problem)
            if log_file:  # the log is elsewhere: the user must still see why
                print(f"shufflefs: {problem}", file=sys.stderr)
            return EXIT_USAGE
        return _serve(config, ready, bool(log_file))
    finally:
        ready.close()
        _remove_logging(handler)


def _terminate_early(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


READAHEAD_KB = VIEW_BLKSIZE >> 10
"""Kernel readahead of the mount, for views served through the page cache (all of them unless
``--direct-io``).  The kernel starts a FUSE mount at 128 KiB, so a reader's 1 MiB read became
eight 128 KiB requests; measured on a 2-core VM (520 MB fixed-size view, corgipile, warm source):
1.3 GB/s at 128 KiB, 1.9-2.0 GB/s at 1 MiB, the largest request the kernel sends.  More does not
help: 1.6 GB JSON lines, warm, 1 MiB reads (`tools/mmap_modes.py`, retired, in git at 4d8b9e3; 3 rounds), none / corgipile
read 1.87 / 1.46 GB/s at 1 MiB, 1.51 / 1.14 at 2 MiB, 1.47 / 1.53 at 4 MiB, 1.42 / 1.31 at 8 MiB."""


def raise_readahead(mnt: str) -> None:
    """Best effort (needs root): set the mount's readahead to `READAHEAD_KB`.

    Runs on a thread once the loop serves: the kernel applies the readahead agreed in the FUSE
    handshake after mounting, and the stat of the mount point is answered by this daemon.  The
    stat is made by a child process (`stat(1)`), never by a thread of this one: a thread waiting
    for its own daemon's answer when that daemon is killed waits uninterruptibly, and the killed
    process could then never end (its FUSE connection lives until it does).  An orphaned child
    gets ENOTCONN instead, when the connection ends with this process."""
    try:
        done = subprocess.run(["stat", "--format=%d", mnt], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise OSError(done.stderr.strip() or f"stat exited with {done.returncode}")
        dev = int(done.stdout)
        with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
            f.write(str(READAHEAD_KB))
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        log.debug("readahead of %s left as it was: %s", mnt, e)


def raise_descriptor_limit() -> tuple[int, int] | None:
    """Raise the soft limit of open files to the hard one, as servers do (the soft limit of a
    login shell, often 1,024 or less, is meant for programs that do not expect many files): every
    open view holds its source, and lookups, listings and index builds need descriptors of their
    own.  Returns (before, after), or None when the limit could not be read or set."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard
        if hard == resource.RLIM_INFINITY:  # not on Linux (nr_open bounds it), but take care
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError) as e:
        log.warning("open files: the soft limit was left as it is (%s)", e)
        return None


def _serve(config: MountConfig, ready: _Ready, to_file: bool) -> int:
    heap.fix_allocator()
    limits = raise_descriptor_limit()
    if limits is not None:
        log.info("open files: at most %d (soft limit %s)", limits[1],
                 f"raised from {limits[0]} to the hard limit" if limits[1] > limits[0] else "already the hard limit")
    from ..windows.view import GATHER

    if GATHER != "compiled":
        log.warning("the compiled gather module (shufflefs/_gather.c) is missing in %s: windows are built "
                    "by the numpy fallback, several times slower; reinstall shufflefs (pip install -e . "
                    "or bash setup.sh) with a C compiler and the Python headers",
                    os.path.dirname(os.path.abspath(__file__)))
    try:
        fs = ShuffleFS(config)
    except (OSError, ValueError, ImportError, ShuffleError) as e:
        log.error("cannot start: %s", e)
        if to_file:  # the log is elsewhere: the user must still see why
            print(f"shufflefs: cannot start: {e}", file=sys.stderr)
        return EXIT_FAILED
    own_tmp = scratch.claim(fs.index_cache.dir)
    fs.index_cache.dir, config.cache_warning = scratch.index_cache(fs.index_cache.dir, own_tmp)
    mnt = os.path.abspath(config.mountpoint)
    source = str(config.source) if scheme_of(str(config.source)) else os.path.abspath(config.source)
    options = {_fsname(source), "subtype=shufflefs", "default_permissions"}
    if config.allow_other:  # other users reach it; the kernel checks their rights (default_permissions)
        options.add("allow_other")
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # until trio takes over the signals, a SIGTERM must still unmount
        previous = signal.signal(signal.SIGTERM, _terminate_early)
    code = EXIT_OK
    mounted = False
    pid_path: str | None = None
    try:
        try:
            fs.catalog.passthrough.ask()  # at INIT (`serve.passthrough`)
            pyfuse3.init(fs, mnt, options)
        except RuntimeError as e:
            log.error("cannot mount %s at %s: %s", config.source, mnt, e)
            if to_file:
                print(f"shufflefs: cannot mount {config.source} at {mnt}: {e}", file=sys.stderr)
            return EXIT_FAILED
        mounted = True
        try:
            pid_path = control.write_pid_file(mnt, source)
        except OSError as e:
            log.warning("cannot write the pid file in %s (%s): 'shufflefs umount' will find this daemon "
                        "only if it answers", control.run_dir(), e)
        log.info(
            "mounted %s at %s (strategy %s, seed %d, epoch %d, pid %d)",
            config.source, mnt, config.spec.strategy, config.spec.seed, config.epoch, os.getpid(),
        )
        if config.block_floor_note:
            log.info("%s", config.block_floor_note)
        trio.run(_main, fs, mnt, ready)
    except KeyboardInterrupt:
        log.info("interrupted: unmounting")
    except BaseException:  # noqa: BLE001 -- whatever happened, unmount below
        log.exception("the filesystem loop failed: unmounting")
        code = EXIT_FAILED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if mounted:
            fs.shutdown()
            indexer.shutdown_default()
            pyfuse3.close(unmount=True)
            if is_mounted(mnt):  # e.g. busy: detach it so that nothing is left behind
                log.warning("%s still mounted after unmount; detaching it lazily", mnt)
                subprocess.run(["fusermount3", "-u", "-z", mnt], check=False, capture_output=True)
            log.info("unmounted %s", mnt)
        control.remove_pid_file(pid_path)
        scratch.release(own_tmp)
    return code
