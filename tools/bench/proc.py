"""Processes the benchmark starts (FUSE daemons), their CPU time and peak memory, and caches.

Every daemon is started here with a known PID, waited for until its mount appears in
/proc/self/mounts, and stopped by that PID (unmount, then SIGTERM, then SIGKILL, then a lazy
unmount), so nothing outlives the benchmark.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def peak_rss(pid: int) -> int:
    """Peak resident set (VmHWM) of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def own_rss(pid: int) -> int:
    """The daemon's own memory: anonymous and shared-memory resident pages (RssAnon + RssShmem),
    without the file pages it maps (the source files that record-level views are copied from
    are page cache, shared with every reader of those files, and counted in VmRSS); 0 once gone."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


SAMPLE_S = 0.005
"""Seconds between samples of `own_rss` (the kernel keeps no peak of it)."""


def reset_peak_rss(pid: int) -> bool:
    """Restart VmHWM from the current RSS (``clear_refs`` 5); False if not permitted."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class Usage:
    """CPU seconds and peak memory of one process over one measurement."""

    cpu_s: float
    peak_rss: int  # VmHWM: with the file pages it maps
    peak_own: int  # the largest `own_rss` sampled every `SAMPLE_S`
    peak_since_start: bool  # VmHWM could not be reset: the peak covers the process's whole life


class Sampler:
    """Brackets a measurement: ``with Sampler(pid) as s: ...`` then ``s.usage``."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.usage: Usage | None = None
        self._stop = threading.Event()
        self._own = 0

    def _sample(self) -> None:
        while True:
            self._own = max(self._own, own_rss(self.pid))
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> "Sampler":
        if self.pid is not None:
            self._reset = reset_peak_rss(self.pid)
            self._cpu0 = cpu_seconds(self.pid)
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is None:
            return
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self._own = max(self._own, own_rss(self.pid))
            self.usage = Usage(cpu_seconds(self.pid) - self._cpu0, peak_rss(self.pid), self._own, not self._reset)


def drop_caches() -> None:
    """Write back dirty pages and drop the page cache (needs root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def can_drop_caches() -> bool:
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def is_mounted(mountpoint: Path) -> bool:
    target = os.path.abspath(mountpoint)
    with open("/proc/self/mounts") as f:
        return any(len(p) > 2 and _unescape(p[1]) == target for p in (line.split() for line in f))


class FuseDaemon:
    """One foreground FUSE process serving ``mountpoint``; a context manager that always unmounts."""

    def __init__(self, cmd: list[str], mountpoint: Path, log: Path, env: dict | None = None) -> None:
        self.cmd, self.mountpoint, self.log, self.env = cmd, Path(mountpoint), Path(log), env
        self.proc: subprocess.Popen | None = None
        self.ready_s = 0.0  # seconds from start to mounted

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0, poll: float = 0.002) -> "FuseDaemon":
        if is_mounted(self.mountpoint):
            raise RuntimeError(f"{self.mountpoint} is already a mount point")
        t0 = time.perf_counter()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         env=self.env, start_new_session=True)
        deadline = t0 + timeout
        try:
            while not is_mounted(self.mountpoint):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.cmd[0]} exited with {self.proc.returncode} before mounting:\n{self.tail()}")
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{self.mountpoint} not mounted within {timeout} s:\n{self.tail()}")
                time.sleep(poll)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - t0
        return self

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """Unmount and reap, escalating by PID; never leaves the mount behind."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None and is_mounted(self.mountpoint):
                r = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
                if r.returncode != 0:
                    proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
        finally:
            if is_mounted(self.mountpoint):
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
            self.proc = None

    def __enter__(self) -> "FuseDaemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_name() -> str:
    """The CPU model, for the report's header."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def mem_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
