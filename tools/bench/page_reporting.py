"""Free page reporting: what a virtual machine's giving idle memory back costs a benchmark.

A virtual machine that reports its free memory to the host (virtio-balloon free page reporting,
``/sys/module/page_reporting``) gives back pages within seconds of their being freed; each such
page costs a fault in the host and its zeroing when the guest uses it again.  A view that writes
a copy or a stage into the page cache needs new pages, the source's read needs none, so rows that
write depend on whether the host took those pages back meanwhile.  The kernel's ``min_free_ms``
(where it has it) holds a freed page back from reporting until it has been free that long.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

from .proc import drop_caches

KNOBS = Path("/sys/module/page_reporting/parameters")
HELD_BACK = "60000"
"""``min_free_ms`` that holds reporting back: a minute, the longest the kernel takes."""
LEFT = Path(tempfile.gettempdir()) / "shufflefs-bench-page-reporting"
"""The knob's value before a run changed it, kept until the run put it back: a run killed where
no ``finally`` runs (SIGKILL) leaves it, and the next run restores the knob from it first
(`restore_left`).  In the temporary directory, which a reboot empties as it resets the knob."""


def knob() -> tuple[Path, str] | None:
    """The setting that holds free page reporting back, and the value that does, if this kernel
    has one this process may write."""
    path = KNOBS / "min_free_ms"  # (`page_reporting_order` only moves the smallest block reported)
    return (path, HELD_BACK) if path.exists() and os.access(path, os.W_OK) else None


@contextlib.contextmanager
def setting(path: Path | None, value: str | None) -> Iterator[None]:
    """``path`` set to ``value`` (None: left as it is) for the block, then restored."""
    if path is None or value is None:
        yield
        return
    restore_left(path)
    old = path.read_text().strip()
    LEFT.write_text(old)
    path.write_text(value)
    try:
        yield
    finally:
        path.write_text(old)
        LEFT.unlink(missing_ok=True)


def restore_left(path: Path | None) -> None:
    """Put back the value a killed run left in `LEFT`, if any."""
    if path is not None and LEFT.exists():
        path.write_text(LEFT.read_text().strip())
        LEFT.unlink()


def settings() -> tuple[Path | None, list[tuple[str, str | None]]]:
    """The knob (None if this kernel has none this process may write) and the settings to run: as
    the machine has it, and held back where it can be."""
    found = knob()
    if found is None:
        return None, [("as the machine has it", None)]
    restore_left(found[0])  # "as the machine has it" is its own value, not a killed run's
    return found[0], [("as the machine has it", None), (f"held back (`{found[0].name}` = {found[1]})", found[1])]


def new_pages(directory: Path, pause: float = 6.0) -> float:
    """Seconds to write 1 GiB into a new file ``pause`` s after dropping the page cache."""
    block = os.urandom(4 << 20)
    drop_caches()
    time.sleep(pause)
    return write_new(directory, block, chunk=len(block))[0]


def write_new(directory: Path, source: bytes, nbytes: int = 1 << 30, chunk: int = 1 << 20,
              preallocate: bool = False) -> tuple[float, float]:
    """Seconds and CPU seconds to write ``nbytes`` into a new unnamed file in ``directory`` (its
    blocks allocated first if ``preallocate``) by ``pwrite``s of ``chunk`` bytes of ``source``,
    cycled (so that the bytes are not all in the CPU's caches); the file goes at its close."""
    fd = os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        if preallocate:
            os.posix_fallocate(fd, 0, nbytes)
        view, chunks = memoryview(source), len(source) // chunk
        t0, c0 = time.perf_counter(), time.process_time()
        for k, at in enumerate(range(0, nbytes, chunk)):
            j = k % chunks
            os.pwrite(fd, view[j * chunk: (j + 1) * chunk], at)
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        os.close(fd)


def in_turn(settings: list[tuple[str, str | None]], r: int) -> list[tuple[str, str | None]]:
    """The settings in round ``r``'s order: forward in even rounds, backward in odd ones, so that
    neither always runs right after the other."""
    return settings[:: 1 if r % 2 == 0 else -1]


def freed_and_idle(directory: Path, rounds: int = 3, idle: float = 8.0) -> tuple[list[float], list[float]]:
    """CPU seconds to write 1 GiB into new page-cache pages: right after 1 GiB was freed (the pages
    the write before gave back), and after the freed memory sat ``idle`` seconds (time for the
    host to take it back where free page reporting runs); ``rounds`` of each."""
    source = os.urandom(256 << 20)
    freed, idled = [], []
    for _ in range(rounds):
        time.sleep(idle)
        idled.append(write_new(directory, source, preallocate=True)[1])
        freed.append(write_new(directory, source, preallocate=True)[1])  # the pages the write before freed
    return freed, idled
