"""How the daemon's allocator (glibc's malloc) keeps and hands back memory: its heaps' settings,
measured against the memory bound and the page faults of window and stage builds.  Best effort:
elsewhere than glibc the allocator keeps its own policy."""

from __future__ import annotations

import ctypes
import logging
import threading

log = logging.getLogger("shufflefs")

MMAP_THRESHOLD = 1 << 20
"""Allocations from this size on are mapped and unmapped on their own.  glibc otherwise raises
its threshold to the size of each large block freed (up to 32 MiB), after which plans' and
windows' temporaries of a few MiB stay in its heaps, fragmented, once freed.  Measured on a
2-core VM (2 GiB of ~1 KiB lines, 64 MiB windows, a new epoch per pass): steady daemon RSS
430 -> 300 MB for ``lirs-page``; peaks 450 -> 326 MB."""
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
TRIM_THRESHOLD = 4 << 20
"""Free memory at the top of a heap that glibc keeps rather than hands back.  Fixing the mmap
threshold also fixes this one at its 128 KiB default, so the per-row temporaries of a Parquet
window (arrays of a few hundred KiB) were handed back and faulted in again, 4 KiB at a time, at
every load.  Measured on a 2-core VM (1 GiB Parquet view, `iter_batches`, a new epoch a pass,
runs alternated): the window builds' page faults fell from 370,000-460,000 an epoch to
30,000-150,000, their system CPU from 1.0-1.2 to 0.3-0.5 s, the reader's rows/s rose 10-30%;
the daemon's peak own memory while the copy is filled stayed at 305-325 MiB (16 MiB kept faults at
25,000 but took it to 330-350, over the bound `tools/bench.py --only parquet` checks).  JSON lines
views barely fault either way."""
STAGE_TRIM_THRESHOLD = 8 << 20
"""`TRIM_THRESHOLD` once the mount encodes Parquet stages (`serve.passthrough`): encoding a run
of pages holds up to ~7 MiB of per-row arrays at once, so at 4 MiB each of the ~220 runs of an
epoch handed some back and faulted it in again.  Measured (1 GiB view, steady epochs, runs
alternated): 34,000-68,000 faults an epoch -> 9,000-16,000, the daemon's CPU 0.9-1.2 -> 0.84-0.98
s an epoch, its own memory 209-218 of the 326 MiB bound.  Not for every mount: with 3 heaps, up
to 12 MiB more is kept (in a run with 8 MiB for every mount, a gzip view's peak was 310 MiB
against its bound of 308, where the run before, with 4 MiB, had 303)."""
M_TRIM_THRESHOLD = -1
ARENAS = 2
"""glibc heaps (arenas) the daemon's threads share.  By default each new thread may get its own,
up to 8 per core, and each keeps the fragments of what its thread freed: with 32 readers of 32
epochs (worker threads come and go), the peak was 0.78-1.33 of the memory bound between runs."""
M_ARENA_MAX = -8

_kept = [0]
_lock = threading.Lock()


def _mallopt(param: int, value: int, name: str) -> None:
    try:
        if not ctypes.CDLL(None).mallopt(param, value):
            log.debug("mallopt(%s) refused", name)
    except (OSError, AttributeError) as e:
        log.debug("allocator left as it is: %s", e)


def fix_allocator() -> None:
    """At the daemon's start: `MMAP_THRESHOLD`, `TRIM_THRESHOLD`, `ARENAS`."""
    for param, value, name in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD, "M_MMAP_THRESHOLD"),
                               (M_ARENA_MAX, ARENAS, "M_ARENA_MAX")):
        _mallopt(param, value, name)
    keep_top(TRIM_THRESHOLD)


def keep_top(size: int) -> None:
    """Keep at least ``size`` bytes free at the top of each heap from now on (never fewer than
    kept before)."""
    with _lock:
        if size <= _kept[0]:
            return
        _kept[0] = size
    _mallopt(M_TRIM_THRESHOLD, size, "M_TRIM_THRESHOLD")
