"""A compressed file's decoded bytes as a `Source`: what views of ``.jsonl.gz``, ``.csv.zst``, ...
read their records from, in the offsets of the file's `index.decoded.DecodedIndex`.

Runs are decoded from the file's restart points (`formats.codecs.DecodedReader`) in one call per
window, so the runs of a window that lie in one restart interval decode it once (a zstd file's
straight into the window's buffer, `formats.zstd_decode`); the source has no descriptors
(`place` is None), so windows are built from `read_runs`.  Its decoders (`DECODERS` of them at
most) and the zstd frame starts they keep outlive it: the next source of the same file version
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

from ..formats.codecs import DecodedReader, Fill, FrameHeads
from ..index.decoded import Restarts
from ..index.table import RecordIndex
from .base import Members, Reader, Runs, Source, open_checks_of


DECODERS = {"gzip": 1, "zstd": 2}
"""Decoders of one file version at most, by codec, shared by its sources (its view, a check of
its header, the next epoch's view): window loads in flight beyond that take turns.  A gzip
decoder holds the file's restart points (about 10 MB per GiB decoded once imported) and
rapidgzip's cache of decoded chunks (about 21 MB, kept by its allocator once taken): measured
on 1.06 GiB, a second one took the daemon's own memory past its bound, while both cores are
busy serving and reading anyway.  A zstd decoder holds one decoded frame; the file version's
decoders share the frame starts they keep (`formats.zstd_decode.FrameHeads`, `HEADS_MOST` at most)."""
KEPT_FILES = 4
"""File versions whose idle decoders are kept once their last source closed, most recently
used kept: the next source of the file (the next epoch's view) takes them up instead of
importing the restart points into a new decoder (about 60 ms for a GiB of gzip)."""


class Decoders:
    """The decoders of one file version (module docstring): at most ``most`` made; a load that
    finds none idle and no room waits for one to be given back."""

    def __init__(self, most: int) -> None:
        self.most, self.made = most, 0
        self.heads = FrameHeads()  # a zstd file's frame starts, kept for the version's life here
        self.free: list[DecodedReader] = []
        self.cond = threading.Condition()

    def take(self, make: Callable[[], DecodedReader], closed: Callable[[], bool]) -> DecodedReader:
        with self.cond:
            while True:
                if closed():
                    raise OSError(errno.EBADF, "decoded source closed")
                if self.free:
                    return self.free.pop()
                if self.made < self.most:
                    self.made += 1
                    break
                self.cond.wait()
        try:
            return make()
        except BaseException:
            self.give(None)
            raise

    def give(self, reader: DecodedReader | None) -> None:
        """``reader`` is idle again (None: one that could not be made)."""
        with self.cond:
            if reader is not None:
                self.free.append(reader)
            else:
                self.made -= 1
            self.cond.notify_all()

    def idle_close(self) -> None:
        """Close the idle decoders (those in use stay, and are idle again when given back)."""
        with self.cond:
            idle, self.free = self.free, []
            self.made -= len(idle)
            self.cond.notify_all()
        for reader in idle:
            reader.close()


_shared: "OrderedDict[tuple, Decoders]" = OrderedDict()
_shared_lock = threading.Lock()


def decoders_of(key: tuple | None, codec: str) -> Decoders:
    """The decoders of file version ``key`` (new ones for None: a source of its own)."""
    if key is None:
        return Decoders(DECODERS.get(codec, 2))
    with _shared_lock:
        got = _shared.pop(key, None) or Decoders(DECODERS.get(codec, 2))
        _shared[key] = got  # the most recent last
        old = [_shared.pop(k) for k in list(_shared)[: max(0, len(_shared) - KEPT_FILES)]]
    for d in old:  # still usable by sources of theirs that are open: they close them last
        d.idle_close()
    return got


def _closed_source(key: tuple | None, decoders: Decoders) -> None:
    """A source of ``decoders`` closed: they stay while kept (`KEPT_FILES`), else close."""
    if key is not None:
        with _shared_lock:
            if _shared.get(key) is decoders:
                return
    decoders.idle_close()


def close_kept_of(path: str) -> None:
    """Close the idle decoders kept for any version of ``path`` (its views read a decoded copy
    now; those in use close when their sources do)."""
    with _shared_lock:
        kept = [_shared.pop(k) for k in list(_shared) if k[0] == path]
    for d in kept:
        d.idle_close()


def close_kept() -> None:
    """Close every idle decoder kept for the next sources (at unmount)."""
    with _shared_lock:
        kept = list(_shared.values())
        _shared.clear()
    for d in kept:
        d.idle_close()


class DecodedSource:
    """The decoded bytes of the compressed file ``raw`` (its open `Source`, ``raw_size`` bytes)
    by its ``restarts``, with their decoded ``copy`` in front when there is one (``release`` is
    called when it is no longer read)."""

    local_fd = -1
    stepwise = True
    """Windows fetch its runs a few MiB at a time (`windows.layout.assemble_steps`): it decodes
    them one after another anyway, so fetching a window's at once only took a window of memory."""

    def __init__(self, raw: Source, restarts: Restarts, raw_size: int, path: str, copy: Source | None = None,
                 release: Callable[[], None] | None = None, fill: Callable[[], Fill | None] | None = None) -> None:
        """``fill``: the file's copy being filled by the frames decoded, when there is one now."""
        self.raw, self.restarts, self.path, self.copy, self._release = raw, restarts, path, copy, release
        self._fill = fill
        fd = getattr(raw, "fd", -1)  # a local file: decoders read it by preads of their own
        self._fd = fd if isinstance(fd, int) else -1
        stamp = getattr(raw, "stamp", None)
        self._key = None if copy is not None or stamp is None else (path, stamp, restarts.codec, int(restarts.plain[-1]))
        self._reader = None if copy is not None else lambda: DecodedReader(
            restarts, raw.read_range, raw_size, path, raw.verify_open, self._fd)
        self._decoders = decoders_of(self._key, restarts.codec) if copy is None else Decoders(0)
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

    def open_checks(self) -> list[tuple[int, int, int, int, int]] | None:
        """`verify_open` as data, for the compiled replies (`SourceFile.open_checks`): the
        compressed file's and the copy's, or None if either has none."""
        return open_checks_of(s for s in (self.raw, self.copy) if s is not None)

    def place(self, index: RecordIndex, first: np.ndarray, count: np.ndarray) -> Runs | None:
        return None if self.copy is None else self.copy.place(index, first, count)

    def file_of(self, fd: int) -> Reader:
        return self.copy.file_of(fd)

    def verify_read(self, offset: int | None) -> None:
        """After reading the copy from ``offset`` (as a pool's member, named by the copy's
        descriptor): the copy and the compressed file are still the indexed versions."""
        self.copy.verify_read(offset)
        self.raw.check()

    def ended(self, offset: int) -> None:
        """The copy ended before ``offset``: `StaleSourceError` (or the change that explains it)."""
        self.raw.check()
        self.copy.ended(offset)

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
        reader = self._take()
        try:
            reader.into_packed(memoryview(buf), np.asarray(starts).tolist(), np.asarray(ends).tolist())
        finally:
            self._give(reader)
        self.raw.verify_open()  # decoded from the version the index describes, still in place
        return buf

    def _take(self) -> DecodedReader:
        """A decoder of this file version no other load uses, reading through this source."""
        if self._reader is None:
            raise OSError(errno.EBADF, "decoded source closed")
        reader = self._decoders.take(self._reader, lambda: self._closed)
        reader.raw, reader.verify, reader.fd = self.raw.read_range, self.raw.verify_open, self._fd
        reader.fill = self._fill() if self._fill is not None else None
        reader.heads = self._decoders.heads
        return reader

    def _give(self, reader: DecodedReader) -> None:
        self._decoders.give(reader)

    def close(self) -> None:
        with self._decoders.cond:
            if self._closed:
                return
            self._closed = True
            self._decoders.cond.notify_all()  # loads of this source waiting for a decoder give up
        try:
            _closed_source(self._key, self._decoders)  # one still decoding is idle when given back
            self.raw.close()
            if self.copy is not None:
                self.copy.close()
        finally:
            if self._release is not None:
                self._release()
