"""Counters of a running mount, readable as ``user.shufflefs.stats`` on the mount root.

Errors are counted and kept (the last few lines) here as well as logged, so that a user who
sees EIO can ask the mount what went wrong without finding the daemon's log.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("shufflefs")

ERROR_LINES = 20
STATS_LIMIT = 48 << 10
"""Bytes the stats JSON may take: an extended attribute holds at most 64 KiB (E2BIG beyond)."""
ERROR_CHARS = 500
"""An error line is cut to this many characters in the stats (the log has it whole)."""
ERROR_PATHS = 1000
"""Paths whose last error `PathErrors` keeps (least recently failed dropped first)."""


class PathErrors:
    """The last error of each path a reader saw fail, for ``user.shufflefs.error``: bounded (an
    LRU of `ERROR_PATHS` paths), kept across epochs, and dropped once a handle opened after it
    reads that path successfully (the reason is then history, and the log still has it)."""

    def __init__(self, limit: int = ERROR_PATHS) -> None:
        self.limit = limit
        self._last: OrderedDict[str, tuple[int, str]] = OrderedDict()  # relpath -> (monotonic ns, line)

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, relpath: str) -> bool:
        return relpath in self._last

    def record(self, relpath: str, line: str) -> None:
        self._last[relpath] = (time.monotonic_ns(), line[:ERROR_CHARS])
        self._last.move_to_end(relpath)
        while len(self._last) > self.limit:
            self._last.popitem(last=False)

    def get(self, relpath: str) -> str | None:
        got = self._last.get(relpath)
        return None if got is None else got[1]

    def succeeded(self, relpath: str, opened_ns: int) -> None:
        """A read of ``relpath`` through a handle opened at ``opened_ns`` worked."""
        got = self._last.get(relpath)
        if got is not None and opened_ns > got[0]:
            del self._last[relpath]


def fit(stats: dict[str, Any], limit: int = STATS_LIMIT) -> bytes:
    """``stats`` as JSON of at most ``limit`` bytes: the largest lists and mappings (one entry
    per file, per epoch) are cut to their first entries until it fits, and ``truncated`` names
    them, so `shufflefs stat` always works however many files and epochs a mount has seen."""
    out = dict(stats)
    cut: list[str] = []
    while True:
        data = json.dumps(out, sort_keys=True, default=str).encode()
        if len(data) <= limit:
            return data
        sizes = {k: len(json.dumps(v, default=str)) for k, v in out.items() if isinstance(v, (dict, list)) and v}
        if not sizes:
            return data[:0] + json.dumps({"truncated": cut, "error": "stats too large"}).encode()
        key = max(sizes, key=sizes.get)
        v = out[key]
        keep = len(v) // 2
        out[key] = dict(list(v.items())[:keep]) if isinstance(v, dict) else v[:keep]
        if key not in cut:
            cut.append(key)
        out["truncated"] = cut


@dataclass
class Stats:
    """Mutated only from the trio thread, so no locking."""

    files_opened: int = 0
    reads: int = 0
    bytes_served: int = 0
    errors: int = 0
    started: float = field(default_factory=time.time)
    last_errors: deque = field(default_factory=lambda: deque(maxlen=ERROR_LINES))
    paths: PathErrors = field(default_factory=PathErrors)

    def served(self, nbytes: int, relpath: str | None = None, opened_ns: int = 0) -> None:
        """A read of ``relpath`` through a handle opened at ``opened_ns`` worked."""
        self.reads += 1
        self.bytes_served += nbytes
        if relpath is not None and relpath in self.paths:
            self.paths.succeeded(relpath, opened_ns)

    def error(self, message: str, relpath: str | None = None, code: int | None = None) -> None:
        """Log ``message`` (it names the file and offset) and remember it, also as the last
        error of ``relpath`` with its errno ``code``."""
        self.errors += 1
        now = time.strftime('%Y-%m-%d %H:%M:%S')
        self.last_errors.append(f"{now} {message[:ERROR_CHARS]}")
        if relpath is not None:
            name = errno.errorcode.get(code, "EIO") if code else "EIO"
            self.paths.record(relpath, f"{now} {name} {message}")
        log.error("%s", message)

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            **extra,
            "uptime_s": round(time.time() - self.started, 3),
            "files_opened": self.files_opened,
            "reads": self.reads,
            "bytes_served": self.bytes_served,
            "errors": self.errors,
            "paths_with_errors": len(self.paths),
            "last_errors": list(self.last_errors),
        }
