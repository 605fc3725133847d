"""The member files of a pool as one `Source`: pooled record ids map to members and shifts."""

from __future__ import annotations

import copy
import errno
import os
import threading
from typing import Callable

import numpy as np

from ..index.table import SourceStamp
from ..index.joined_index import PooledIndex, split_runs
from .base import Members, Runs, Source, finish_all, gather, open_checks_of

OPEN_CHECKS = 16
"""The most member files a pool's reads may be answered by compiled replies for (`open_checks`)."""


class PoolSource:
    """The member files of a pool, each pinned to its stamp; shared by the views of the pool's
    shards (one descriptor per member however many shards are open), closed by its last user."""

    local_fd = -1

    def __init__(self, members: list[str], index: PooledIndex, open_member: Callable[[str, SourceStamp], Source]) -> None:
        self.index = index
        self.files: list[Source] = []
        self._users = 1
        self._lock = threading.Lock()
        try:
            for m, stamp in zip(members, index.member_stamps):
                self.files.append(open_member(m, stamp))
        except BaseException:
            self._close()
            raise
        # members without descriptors (remote): the pool has none either (see `Source.place`)
        none = np.zeros(0, np.int64)
        self._placed = all(f.place(index, none, none) is not None for f in self.files)
        self.fds = np.array([f.fd if self._placed else -1 for f in self.files], np.int64)
        self._by_fd = {f.fd: m for m, f in enumerate(self.files)} if self._placed else {}

    @property
    def closed(self) -> bool:
        return self._users == 0

    def share(self) -> "PoolSource":
        """One more user (a view); each calls `close` once."""
        with self._lock:
            if self._users == 0:
                raise OSError(errno.EBADF, "pool source closed")
            self._users += 1
        return self

    def reading(self, index: PooledIndex) -> "PoolSource":
        """These files read through ``index``, another index of the same files (a mixture's
        pool of its files): shares the descriptors, and is never closed itself."""
        other = copy.copy(self)
        other.index = index
        return other

    def check(self) -> None:
        for f in self.files:
            f.check()

    def verify_open(self) -> None:
        for f in self.files:
            f.verify_open()

    def open_checks(self) -> list[tuple[int, int, int, int, int]] | None:
        """Every member's `SourceFile.open_checks`, for pools of at most `OPEN_CHECKS` files
        (a reply's checks are one ``fstat`` each); None otherwise, or if a member has none."""
        return None if len(self.files) > OPEN_CHECKS else open_checks_of(self.files)

    def place(self, index: PooledIndex, first: np.ndarray, count: np.ndarray) -> Runs | None:
        """The runs cut where members end, each in its member file at the member's shift."""
        if not self._placed:
            return None
        first, count, member = index.split_runs(first, count)
        return Runs(first, count, self.fds[index.member_file[member]], index.shifts[member])

    def mapped_members(self) -> Members | None:
        """Every member's mapping (`Members`); None unless each file with records has one."""
        if not self._placed:
            return None
        index, maps, slot = self.index, [], np.full(len(self.files), -1, np.int64)
        used = np.zeros(len(self.files), bool)
        used[index.member_file[np.diff(index.member_firsts) > 0]] = True
        for m, f in enumerate(self.files):
            ask = getattr(f, "mapping", None)
            mapped = ask() if ask is not None else None
            if mapped is not None:
                slot[m] = len(maps)
                maps.append(mapped)
            elif used[m]:
                return None
        return Members(tuple(maps), np.asarray(index.member_firsts[:-1], np.int64), slot[index.member_file],
                       np.asarray(index.shifts, np.int64), self.fds[index.member_file])

    def file_of(self, fd: int) -> Source:
        return self.files[self._by_fd[fd]]

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Byte ranges of the index (ascending, perhaps across members), concatenated (remote
        members, or the build without the compiled module): cut where members start, one read
        per file of its pieces in file order (a mixture's pieces of one file may come in any
        order: they are read sorted and put back in place)."""
        index = self.index
        first, count, member = split_runs(index.bounds[index.member_firsts], starts, np.asarray(ends) - starts)
        total = int(count.sum())
        buf = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
        at, file = first + index.shifts[member], index.member_file[member]
        dest = np.cumsum(count) - count
        order = np.lexsort((at, file))
        direct = bool(np.all(order == np.arange(len(order))))
        if direct:
            into = buf
        else:
            at, file, count, dest = at[order], file[order], count[order], dest[order]
            into = np.empty(total, np.uint8)
        pos, waits = 0, []
        for piece in np.split(np.arange(len(file)), np.flatnonzero(np.diff(file)) + 1):
            if len(piece):
                m, size = int(file[piece[0]]), int(count[piece].sum())
                f, part = self.files[m], into[pos: pos + size]
                begin = getattr(f, "begin_runs", None)  # remote members: all in flight, then wait
                if begin is not None:
                    waits.append(begin(at[piece], at[piece] + count[piece], part))
                else:
                    f.read_runs(at[piece], at[piece] + count[piece], part)
                pos += size
        finish_all(waits)  # every one waited for: none may still write into ``buf`` after a raise
        if not direct:
            gather(into, np.cumsum(count) - count, count, buf, dest)
        return buf

    def read_range(self, start: int, end: int) -> bytes:
        raise ValueError("a view over a pool needs its header and trailer")

    def advise(self, index: PooledIndex, first: np.ndarray, count: np.ndarray) -> None:
        self._fadvise(index, first, count, os.POSIX_FADV_WILLNEED)

    def drop(self, index: PooledIndex, first: np.ndarray, count: np.ndarray) -> None:
        """The runs' pages out of the page cache (`SourceFile.drop`)."""
        self._fadvise(index, first, count, os.POSIX_FADV_DONTNEED)

    def _fadvise(self, index: PooledIndex, first: np.ndarray, count: np.ndarray, advice: int) -> None:
        if not self._placed:
            return
        first, count, member = index.split_runs(first, count)
        b = index.bounds
        starts, ends = b[first] + index.shifts[member], b[first + count] + index.shifts[member]
        for m, s, e in zip(index.member_file[member].tolist(), starts.tolist(), ends.tolist()):
            os.posix_fadvise(self.files[m].fd, s, e - s, advice)

    def close(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self._close()

    def _close(self) -> None:
        for f in self.files:
            f.close()


