"""A compressed file's decoded bytes as a `Source`: what views of ``.jsonl.gz``, ``.csv.zst``, ...
read their records from, in the offsets of the file's `index.decoded.DecodedIndex`.

Runs are decoded from the file's restart points (`formats.codecs.DecodedReader`), one run after
another in ascending order, so the runs of a window that lie in one restart interval decode it
once; the source has no descriptors (`place` is None), so windows are built from `read_runs`.
Its decoders (`DECODERS` of them at most) outlive it: the next source of the same file version
(the next epoch's view) takes them up (`KEPT_FILES`).  A
file without restart points worth using is read from a decoded ``copy`` on node-local disk
instead (a `SourceFile` of it, made by `stages.decoded`): then the compiled gather reads the copy
as it reads any file.  Either way the compressed file is held to the version its index was built
from, as a plain source is: a change is `StaleSourceError`, a damaged stream `FormatError`, never
bytes.
"""

from __future__ import annotations

import errno
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from ..formats.codecs import DecodedReader
from ..index.decoded import Restarts
from ..index.table import RecordIndex
from .base import Members, Reader, Runs, Source


DECODERS = {"gzip": 1, "zstd": 2}
"""Decoders a source makes at most, by codec: window loads in flight beyond that take turns.
A gzip decoder holds the file's restart points (about 10 MB per GiB decoded once imported)
and rapidgzip's cache of decoded chunks (about 21 MB), and its thread's allocations stay with
the daemon: measured on 1.06 GiB, a second one took the daemon's own memory past its bound
while the two loads side by side read no faster (both cores are busy serving and reading).  A
zstd decoder holds one decoded frame."""


KEPT_FILES = 4
"""Files whose idle decoders outlive the sources that made them, most recently closed kept:
the next source of the same file version (the next epoch's view, a check of its header) takes
them instead of importing the restart points into a new decoder (about 60 ms and, for gzip, a
new decoding thread whose allocator keeps what it took)."""
_kept: "OrderedDict[tuple, list[DecodedReader]]" = OrderedDict()
_kept_lock = threading.Lock()


def _keep(key: tuple | None, readers: list[DecodedReader]) -> None:
    """Keep the idle ``readers`` of a closed source of file version ``key`` for the next one."""
    closing = list(readers) if key is None else []
    if key is not None:
        with _kept_lock:
            got = _kept.pop(key, [])
            got += readers
            closing += got[DECODERS.get(readers[0].restarts.codec, 2):] if readers else []
            _kept[key] = got[: len(got) - len(closing)]
            while len(_kept) > KEPT_FILES:
                closing += _kept.pop(next(iter(_kept)))
    for reader in closing:
        reader.close()


def _kept_for(key: tuple | None) -> DecodedReader | None:
    if key is None:
        return None
    with _kept_lock:
        got = _kept.get(key)
        return got.pop() if got else None


def close_kept() -> None:
    """Close every kept decoder (at unmount)."""
    with _kept_lock:
        readers = [r for got in _kept.values() for r in got]
        _kept.clear()
    for reader in readers:
        reader.close()


class DecodedSource:
    """The decoded bytes of the compressed file ``raw`` (its open `Source`, ``raw_size`` bytes)
    by its ``restarts``, with their decoded ``copy`` in front when there is one (``release`` is
    called when it is no longer read)."""

    local_fd = -1
    stepwise = True
    """Windows fetch its runs a few MiB at a time (`windows.layout.assemble_steps`): it decodes
    them one after another anyway, so fetching a window's at once only took a window of memory."""

    def __init__(self, raw: Source, restarts: Restarts, raw_size: int, path: str, copy: Source | None = None,
                 release: Callable[[], None] | None = None) -> None:
        self.raw, self.restarts, self.path, self.copy, self._release = raw, restarts, path, copy, release
        self._lock = threading.Condition()
        self._free: list[DecodedReader] = []  # decoders not decoding now
        self._made = 0
        self._most = DECODERS.get(restarts.codec, 2)
        fd = getattr(raw, "fd", -1)  # a local file: decoders read it by preads of their own
        self._fd = fd if isinstance(fd, int) else -1
        stamp = getattr(raw, "stamp", None)
        self._key = None if copy is not None or stamp is None else (path, stamp, restarts.codec, int(restarts.plain[-1]))
        self._reader = None if copy is not None else lambda: DecodedReader(
            restarts, raw.read_range, raw_size, path, raw.verify_open, self._fd)
        self._closed = False

    @property
    def fd(self) -> int:
        """The copy's descriptor (a pool's placed member), -1 without one."""
        return getattr(self.copy, "fd", -1)

    @property
    def staged(self) -> bool:
        return self.copy is not None

    def check(self) -> None:
        self.raw.check()
        if self.copy is not None:
            self.copy.check()

    def verify_open(self) -> None:
        self.raw.verify_open()
        if self.copy is not None:
            self.copy.verify_open()

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs | None:
        return None if self.copy is None else self.copy.place(index, first, count)

    def file_of(self, fd: int) -> Reader:
        return self.copy.file_of(fd)

    def mapping(self) -> object | None:
        ask = getattr(self.copy, "mapping", None)
        return ask() if ask is not None else None

    def mapped_members(self) -> Members | None:
        ask = getattr(self.copy, "mapped_members", None)
        return ask() if ask is not None else None

    def advise(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> None:
        if self.copy is not None:
            self.copy.advise(index, first, count)

    def read_range(self, start: int, end: int) -> bytes:
        return self.read_runs(np.array([start], np.int64), np.array([end], np.int64)).tobytes()

    def read_runs(self, starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The decoded ranges (ascending), concatenated; the compressed file is verified after."""
        if self.copy is not None:
            return self.copy.read_runs(starts, ends, out)
        total = int((np.asarray(ends) - np.asarray(starts)).sum())
        buf = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
        view, pos = memoryview(buf), 0
        reader = self._take()
        try:
            for s, e in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist()):
                reader.into(s, view[pos: pos + e - s])
                pos += e - s
        finally:
            self._give(reader)
        self.raw.verify_open()  # decoded from the version the index describes, still in place
        return buf

    def _take(self) -> DecodedReader:
        """A decoder no other load uses: a new one while fewer than `DECODERS` of the codec are
        made, else the next one given back (loads in flight beyond that wait for it)."""
        with self._lock:
            while True:
                if self._closed or self._reader is None:
                    raise OSError(errno.EBADF, "decoded source closed")
                if self._free:
                    return self._free.pop()
                if self._made < self._most:
                    self._made += 1
                    break
                self._lock.wait()
        try:
            kept = _kept_for(self._key)
            if kept is not None:  # a closed source's, of this file version: now reading through this one
                kept.raw, kept.verify, kept.fd = self.raw.read_range, self.raw.verify_open, self._fd
                return kept
            return self._reader()
        except BaseException:
            with self._lock:
                self._made -= 1
                self._lock.notify()
            raise

    def _give(self, reader: DecodedReader) -> None:
        with self._lock:
            if self._closed:
                reader.close()
            else:
                self._free.append(reader)
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._free = self._free, []
            self._lock.notify_all()
        try:
            _keep(self._key, idle)  # one still decoding is closed when it is given back
            self.raw.close()
            if self.copy is not None:
                self.copy.close()
        finally:
            if self._release is not None:
                self._release()
