"""Counters of a running mount, readable as ``user.shufflefs.stats`` on the mount root.

Errors are counted and kept (the last few lines) here as well as logged, so that a user who
sees EIO can ask the mount what went wrong without finding the daemon's log.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("shufflefs")

ERROR_LINES = 20


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
        self.last_errors.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}")
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
