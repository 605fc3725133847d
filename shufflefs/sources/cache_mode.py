"""Whether a source file's pages stay in the page cache once a window is built from them.

A view's bytes are cached twice while it is read: as the source pages its windows were read
from, and as the view's own pages (served through the page cache).  A file whose source and view
pages cannot both stay cached gains nothing from keeping the source pages: they are evicted
before the next epoch reads them again, and until then they compete with the view's pages and
the windows for the memory left, so the kernel spends its time reclaiming.  For such a file the
source pages of a window's runs are dropped as soon as the window is built
(``POSIX_FADV_DONTNEED``; `View.load_window`), so that each byte is cached once, as the view's.
Reads stay buffered: the kernel's readahead, which reads this disk fastest, is kept.

The room is the smaller of the machine's memory and the memory limit of the daemon's cgroup (and
its ancestors'): v2 ``memory.max``, v1 ``memory.limit_in_bytes``.  ``--source-cache`` forces
either choice; a file whose pages are already almost all cached (another reader keeps it so)
keeps them under ``auto``.  Pure logic, no FUSE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SOURCE_CACHE_MODES = ("auto", "keep", "drop", "direct")
"""``--source-cache``: ``auto`` chooses per file (`choose`), the others force it."""
AUTO_LARGE = "direct"
"""What ``auto`` chooses for a file that does not fit (measured: docs/benchmark.md, Larger than
memory): O_DIRECT loads for windows of short runs, the others buffered with their pages dropped
behind (`DIRECT_RUN`)."""
DIRECT_RUN = 8 << 20
"""Under ``auto``, a window is loaded by O_DIRECT reads when its runs average fewer bytes than
this (blocks of a block order, 128 KiB by default); a window of longer runs (``none``: one run)
is read buffered, where the kernel's readahead reads the disk fastest, and its pages dropped."""
UNLIMITED = 1 << 60
"""cgroup v1 writes "no limit" as a number near 2**63."""
RESIDENT = 0.95
"""A file with at least this share of its pages cached keeps them under ``auto``."""


@dataclass(frozen=True)
class Room:
    """How much the page cache can hold for this daemon, and what sets that."""

    nbytes: int
    where: str


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return value if value < UNLIMITED else None


def cgroup_limit(proc_cgroup: str, root: str | os.PathLike = "/sys/fs/cgroup") -> tuple[int, str] | None:
    """The tightest memory limit on the cgroup named in ``proc_cgroup`` (the text of
    /proc/self/cgroup) and its ancestors, with the file that sets it; None without one."""
    base = Path(root)
    best: tuple[int, str] | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2: one unified hierarchy (under unified/ beside v1 ones)
            top, name = (base / "unified" if (base / "unified").is_dir() else base), "memory.max"
        elif "memory" in controllers.split(","):
            top, name = base / "memory", "memory.limit_in_bytes"
        else:
            continue
        here = Path(rel.strip() or "/")
        for d in [here, *here.parents]:
            f = top / str(d).lstrip("/") / name
            got = _read_limit(f)
            if got is not None and (best is None or got < best[0]):
                best = (got, str(f))
    return best


def mem_total(meminfo: str) -> int:
    """MemTotal of /proc/meminfo's text, in bytes (0 if absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def room(proc_cgroup: str, meminfo: str, root: str | os.PathLike = "/sys/fs/cgroup") -> Room:
    """The page cache's room: the machine's memory, or the cgroup's limit if smaller."""
    total = mem_total(meminfo)
    limit = cgroup_limit(proc_cgroup, root)
    if limit is not None and (total == 0 or limit[0] < total):
        return Room(limit[0], f"cgroup limit {limit[1]}")
    return Room(total, "MemTotal")


def this_room() -> Room:
    """`room` of this process (0 bytes, "unknown" if /proc cannot be read)."""
    try:
        return room(Path("/proc/self/cgroup").read_text(), Path("/proc/meminfo").read_text())
    except OSError:
        return Room(0, "unknown")


def choose(size: int, space: Room, forced: str = "auto", resident: float = 0.0,
           direct: bool = True) -> tuple[str, str]:
    """``("keep" | "drop" | "direct", why)`` for a source of ``size`` bytes, ``resident`` the
    share of its pages cached now, ``direct``: O_DIRECT loads are possible for it (a local file,
    not tar).  ``auto`` takes `AUTO_LARGE` when the source and its view (2 x size) do not fit
    the room; ``direct`` where it is not possible is ``drop``."""
    if forced not in SOURCE_CACHE_MODES:
        raise ValueError(f"source cache mode must be one of {', '.join(SOURCE_CACHE_MODES)}: {forced!r}")
    if forced != "auto":
        if forced == "direct" and not direct:
            return "drop", "--source-cache direct, not possible for this source"
        return forced, "--source-cache"
    if space.nbytes <= 0:
        return "keep", "memory unknown"
    if 2 * size <= space.nbytes:
        return "keep", "source and view fit the page cache"
    if resident >= RESIDENT:
        return "keep", "source already cached"
    if AUTO_LARGE == "direct" and not direct:
        return "drop", "source and view do not fit the page cache (direct not possible)"
    return AUTO_LARGE, "source and view do not fit the page cache"


class SourceCache:
    """The mount's ``--source-cache`` choice for every view it opens, with what it chose (for
    ``shufflefs stat``).  Counters are only added to (from worker threads: a stat, not a lock)."""

    def __init__(self, forced: str = "auto", space: Room | None = None) -> None:
        if forced not in SOURCE_CACHE_MODES:
            raise ValueError(f"source cache mode must be one of {', '.join(SOURCE_CACHE_MODES)}: {forced!r}")
        self.forced = forced
        self.room = space if space is not None else this_room()
        self.views: dict[str, int] = {}  # "keep: why" / "drop: why" -> views opened so
        self.dropped_bytes = 0
        self.loads: dict[str, int] = {}  # windows loaded: "buffered" / "direct"

    def decide(self, size: int, resident: Callable[[], float], direct: bool = True) -> str:
        """How a view over ``size`` source bytes loads its windows (`choose`): ``keep``, ``drop``
        (its runs' pages behind each window) or ``direct``; ``resident()`` (the share of them
        cached now) is asked only when it matters."""
        fits = self.forced != "auto" or self.room.nbytes <= 0 or 2 * size <= self.room.nbytes
        mode, why = choose(size, self.room, self.forced, 0.0 if fits else resident(), direct)
        key = f"{mode}: {why}"
        self.views[key] = self.views.get(key, 0) + 1
        return mode

    def dropped(self, nbytes: int) -> None:
        self.dropped_bytes += nbytes

    def direct_for(self, nbytes: int, runs: int) -> bool:
        """Whether a window of ``runs`` runs of ``nbytes`` in all, of a view in ``direct`` mode,
        is loaded by O_DIRECT reads: always when forced, else when its runs are short."""
        return self.forced == "direct" or nbytes < DIRECT_RUN * max(runs, 1)

    def loaded(self, how: str) -> None:
        self.loads[how] = self.loads.get(how, 0) + 1

    def describe(self) -> dict:
        return {"option": self.forced, "room": self.room.nbytes, "room_from": self.room.where,
                "views": dict(self.views), "window_loads": dict(self.loads), "dropped_bytes": self.dropped_bytes}
