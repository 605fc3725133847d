"""Counters of a running mount, readable as ``user.shufflefs.stats`` on the mount root.

Errors are counted and kept (the last few lines) here as well as logged, so that a user who
sees EIO can ask the mount what went wrong without finding the daemon's log.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("shufflefs")

ERROR_LINES = 20
STATS_LIMIT = 48 << 10
"""Bytes the stats JSON may take: an extended attribute holds at most 64 KiB (E2BIG beyond)."""
ERROR_CHARS = 500
"""An error line is cut to this many characters in the stats (the log has it whole)."""


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

    def served(self, nbytes: int) -> None:
        self.reads += 1
        self.bytes_served += nbytes

    def error(self, message: str) -> None:
        """Log ``message`` (it names the file and offset) and remember it."""
        self.errors += 1
        self.last_errors.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message[:ERROR_CHARS]}")
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
            "last_errors": list(self.last_errors),
        }
