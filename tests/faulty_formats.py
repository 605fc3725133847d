"""Formats whose scan misbehaves (kills its process, changes its file, waits), for tests of
`shufflefs.formats.build`.

They live in a plain module (not a test module) so that an indexing process can import them
cheaply when it unpickles one.  The killing ones refuse to run outside a child process: if such
a scan ever ran in the test process itself, the test run would die instead of failing.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import time

from shufflefs.formats import LinesFormat


def _only_in_a_child() -> None:
    if multiprocessing.parent_process() is None:
        raise AssertionError("this scan kills its process: it must run in an indexing process")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file per expected crash


class SigbusFormat(LinesFormat):
    """Dies of SIGBUS as soon as it is asked to scan anything."""

    name = "test-sigbus"

    def scan(self, data, path, progress=None):
        _only_in_a_child()
        os.kill(os.getpid(), signal.SIGBUS)
        raise AssertionError("still alive after SIGBUS")


class TruncatingFormat(LinesFormat):
    """Halves the file under its own mmap, then reads the last mapped byte: a real SIGBUS."""

    name = "test-truncating"

    def scan(self, data, path, progress=None):
        _only_in_a_child()
        os.truncate(path, len(data) // 2)
        int(data[-1])  # the page behind this byte no longer exists
        raise AssertionError("read a byte past the end of a truncated file")


class AppendingFormat(LinesFormat):
    """Appends a line to the file it scans, as a concurrent writer would."""

    name = "test-appending"

    def scan(self, data, path, progress=None):
        with open(path, "ab") as f:
            f.write(b"more\n")
        return super().scan(data, path, progress)


class GatedFormat(LinesFormat):
    """Appends a line to ``started`` when a scan begins, then waits until ``release`` exists."""

    name = "test-gated"

    def __init__(self, started: str, release: str) -> None:
        super().__init__()
        self.started, self.release = started, release

    def params(self) -> dict:
        return {**super().params(), "started": self.started, "release": self.release}

    def scan(self, data, path, progress=None):
        with open(self.started, "a") as f:
            f.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 30
        while not os.path.exists(self.release):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.release} never appeared")
            time.sleep(0.01)
        return super().scan(data, path, progress)
