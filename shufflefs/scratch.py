"""Temporary files of a daemon, kept where the daemon can find and remove them after a crash.

Index cache entries are written to temporary files first (``<pid>-*.tmp`` beside the entry) and
the indexing workers' multiprocessing machinery makes a ``pymp-*`` folder in the temporary
directory.  A daemon killed with SIGKILL cleans neither, so every daemon keeps its temporaries
in ``$TMPDIR/shufflefs-<pid>/`` (short: the forkserver's socket path must fit in 108 bytes) and
removes, at start, what dead daemons left there and in the cache (a temporary whose pid no
longer runs).  Live daemons keep theirs.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("shufflefs")

RUN_PREFIX = "shufflefs-"
TMP_NAME = re.compile(r"^(\d+)-.*\.tmp$")


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


def release(own: Path | None) -> None:
    """Remove ``own`` once multiprocessing has removed its own folder in it (its finalizers run
    at exit, by priority: the temporary directory's at -100, this at -200)."""
    if own is not None:
        from multiprocessing import util

        util.Finalize(None, shutil.rmtree, args=(own,), kwargs={"ignore_errors": True}, exitpriority=-200)
