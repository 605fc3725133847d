"""One shuffled view of one source file for one epoch: blocking I/O, run from worker threads.

A `View` owns no FUSE state; the filesystem layer calls `load_window` from a thread and slices
the result.  Every load checks the source against the stamp its index was built from (before
and after reading), so a file changed or removed while mounted yields `StaleSourceError`
instead of bytes that mix two versions.
"""

from __future__ import annotations

import os

import numpy as np

from .errors import StaleSourceError
from .index import RecordIndex, SourceStamp
from .layout import Layout, assemble
from .strategies.base import Plan


class SourceFile:
    """An open source file pinned to the stamp of its index."""

    def __init__(self, path: str, stamp: SourceStamp) -> None:
        self.path = path
        self.stamp = stamp
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StaleSourceError(path, None, "source file was removed") from None
        try:
            self._verify(os.fstat(self.fd), None)
        except BaseException:
            os.close(self.fd)
            raise

    def _verify(self, st: os.stat_result, offset: int | None) -> None:
        now = SourceStamp.of(st)
        if st.st_nlink == 0:
            raise StaleSourceError(self.path, offset, "source file was removed or replaced while mounted")
        if now != self.stamp:
            raise StaleSourceError(
                self.path,
                offset,
                f"source changed while mounted (size {self.stamp.size} -> {now.size}, "
                f"mtime_ns {self.stamp.mtime_ns} -> {now.mtime_ns})",
            )

    def verify_open(self) -> None:
        """Cheap per-read check (one fstat, no path lookup): the open file is unchanged and still
        linked, so bytes of a window loaded earlier still describe the source."""
        self._verify(os.fstat(self.fd), None)

    def check(self, offset: int | None = None) -> None:
        """Raise unless the path still names the same, unchanged file."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StaleSourceError(self.path, offset, "source file was removed") from None
        self._verify(st, offset)

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Read the ranges in the given (ascending) order into one buffer."""
        total = int((ends - starts).sum())
        buf = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
        mv = memoryview(buf)
        pos = 0
        for s, e in zip(starts.tolist(), ends.tolist()):
            while s < e:
                got = os.preadv(self.fd, [mv[pos: pos + (e - s)]], s)
                if got == 0:
                    self._verify(os.fstat(self.fd), s)
                    raise StaleSourceError(self.path, s, "unexpected end of file")
                s += got
                pos += got
        self._verify(os.fstat(self.fd), int(starts[0]) if len(starts) else None)
        return buf

    def read_range(self, start: int, end: int) -> bytes:
        return self.read_runs(np.array([start]), np.array([end])).tobytes()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class View:
    """Layout + source for one (file, epoch): turns window numbers into bytes."""

    def __init__(self, path: str, index: RecordIndex, plan: Plan) -> None:
        if index.stamp is None:
            raise ValueError("a mounted view needs an index with a source stamp")
        self.path = path
        self.index = index
        self.plan = plan
        self.layout = Layout(index, plan)
        self.source = SourceFile(path, index.stamp)
        try:
            self.header = self.source.read_range(0, index.header_end)
            self.trailer = self.source.read_range(index.trailer_start, index.size)
        except BaseException:
            self.source.close()
            raise

    @property
    def size(self) -> int:
        return self.layout.size

    def load_window(self, k: int, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
        """Read window k's records in source order and assemble them in view order (blocking).

        ``out`` receives the window and ``scratch`` the source bytes when large enough; reusing
        both across loads avoids first-touching fresh memory for every window.
        """
        self.source.check()
        ids = self.plan.window(k)
        return assemble(self.index, ids, lambda s, e: self.source.read_runs(s, e, scratch), out)

    def close(self) -> None:
        self.source.close()
