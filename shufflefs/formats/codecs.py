"""Decoding compressed sources, whole (to index them) and from restart points (to read runs).

A compressed file's records live in its decoded bytes.  Reading a run of them at random means
starting to decode somewhere before it: at a *restart point*, a decoded offset from which the
stream can be decoded on its own.

* gzip: rapidgzip (ISA-L inflate, ~2.5x zlib here) decodes the file once and records a restart
  point about every `GZIP_SPACING` decoded bytes, each with the 32 KiB of history it needs; that
  index is kept (gztool format, history compressed: about 0.5% of the decoded bytes) and
  imported into a decoder that seeks to any offset.  Measured against indexed_gzip on 1.06 GiB of
  JSON lines (`tools/bench.py --only compressed`): see docs/benchmark.md.
* zstd: every frame is a restart point (a file of several frames, or of the seekable format,
  whose seek table is a skippable frame this walk passes over).  Frames are found by walking
  their headers and block headers (RFC 8878), decoded with zstandard (`zstd_decode`).  A file of one frame has
  none but its start: it is decoded once into a node-local copy instead (`sources.decoded`).

Both libraries are optional (the ``compressed`` extra): `missing` names what a codec lacks, and
files of a codec whose library is missing pass through unchanged.  Every decode error becomes a
`FormatError` naming the file and the offset, never bytes.
"""

from __future__ import annotations

import atexit
import importlib
import io
import os
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np

from ..errors import FormatError, ShuffleError
from ..index.decoded import Restarts
from .gzip_edges import check_magic, padding_note, stream_end
from .range_file import RangeFile, Read, read_full
from .zstd_decode import Fill, FrameHeads, ZstdDecoder
from .zstd_walk import zstd_frames

GZIP, ZSTD = "gzip", "zstd"
LIBRARIES = {GZIP: "rapidgzip", ZSTD: "zstandard"}
GZIP_SPACING = 1 << 20
"""rapidgzip's chunk size: a restart point about every MiB of decoded bytes (1,051 points for
1.06 GiB; its index 4.7 MB, 4 MB in a decoder's memory).  A random 1 MiB block reads at about 215
MB/s of decoded bytes on one core (a 256 KiB spacing: 232 MB/s, a 15.5 MB index, builds twice
as slow; `index.decoded.RESTART_BLOCKS`)."""
DECODE_STEP = 4 << 20
"""Decoded bytes handed on at a time while a whole file is decoded (the memory a scan holds)."""
READ_SIZE = 1 << 20
"""Compressed bytes a zstd stream reader asks for at a time (a call back into Python each)."""


def missing(codec: str) -> str | None:
    """The module ``codec`` needs that cannot be imported, or None if it can."""
    name = LIBRARIES[codec]
    try:
        importlib.import_module(name)
    except ImportError:
        return name
    return None


# --------------------------------------------------------------------------- whole decodes


def decode_all(codec: str, read: Read, size: int, path: str, progress: Callable[[int], None] | None = None
               ) -> tuple[Iterator[memoryview], Callable[[], Restarts]]:
    """Decode a whole compressed file of ``size`` bytes, read by ``read(start, end)``, in steps
    of about `DECODE_STEP` bytes: an iterator of the decoded steps (each valid until the next),
    and a function giving the restart points once it is exhausted.  Checksums and sizes are
    verified as the library does (every gzip member's CRC-32 and length; zstd content checksums
    and sizes); a damaged stream raises `FormatError` at its compressed offset."""
    if size == 0:  # an empty file: read as empty (as gzip.open and zstd readers do)
        none = np.zeros(0, np.int64)
        return iter(()), lambda: Restarts(codec, np.zeros(1, np.int64), none, none, np.zeros(0, np.uint8))
    if codec == GZIP:
        return _gzip_all(read, size, path, progress)
    return _zstd_all(read, size, path, progress)


def decode_bytes(codec: str, data: bytes) -> bytes:
    """A whole compressed file's decoded bytes (a view read back, to compare with its order)."""
    steps, _ = decode_all(codec, *buffer_read(data), "<bytes>")
    return b"".join(bytes(step) for step in steps)


def buffer_read(data: object) -> tuple[Read, int]:
    """``read(start, end)`` over a buffer (a file mapped to scan it), and its size."""
    view = memoryview(data).cast("B")
    return (lambda a, b: view[a:b]), len(view)


def _gzip_all(read: Read, size: int, path: str, progress: Callable[[int], None] | None
              ) -> tuple[Iterator[memoryview], Callable[[], Restarts]]:
    import rapidgzip

    got: list[Restarts] = []

    def steps() -> Iterator[memoryview]:
        check_magic(read, size, path)
        end = stream_end(read, size)  # before zero padding
        raw = RangeFile(read, end, progress)
        with rapidgzip.RapidgzipFile(raw, parallelization=1, chunk_size=GZIP_SPACING) as f:
            buf, done = bytearray(DECODE_STEP), 0
            while True:
                try:
                    n = f.readinto(buf)
                except (ValueError, RuntimeError, OSError) as e:
                    raise FormatError(path, raw.tell(), f"corrupt gzip stream (its first {done} decoded bytes were "
                                      f"whole): {e}{padding_note(read, size)}") from None
                if not n:
                    break
                done += n
                yield memoryview(buf)[:n]
            ended = f.tell_compressed()
            if ended != 8 * end:  # rapidgzip may end a stream cut inside its deflate data without an error
                raise FormatError(path, ended // 8, f"truncated gzip stream: its decoding ended at byte {ended // 8} "
                                  f"of {end} (its first {done} decoded bytes are not known to be whole)"
                                  f"{padding_note(read, size)}")
            offsets = f.block_offsets()
            plain = sorted(set(offsets.values()) | {0})
            out = io.BytesIO()
            f.export_index(out, rapidgzip.IndexFormat.GZTOOL)
            decoded = f.tell()
        plain = np.array([p for p in plain if p < decoded] + [decoded], np.int64)
        none, last = np.zeros(0, np.int64), np.array([end] if end < size else [], np.int64)
        got.append(Restarts(GZIP, plain, none, last, np.frombuffer(out.getvalue(), np.uint8)))

    return steps(), lambda: got[0]


def _zstd_all(read: Read, size: int, path: str, progress: Callable[[int], None] | None
              ) -> tuple[Iterator[memoryview], Callable[[], Restarts]]:
    import zstandard

    starts, ends, sizes = zstd_frames(read, size, path)
    got: list[Restarts] = []

    def steps() -> Iterator[memoryview]:
        plain = [0]
        dctx = zstandard.ZstdDecompressor()
        buf = bytearray(DECODE_STEP)  # one buffer for every step: a fresh one would be mapped and faulted in each time
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            done = 0
            try:
                frame = RangeFile(lambda s, e, a=a: read(a + s, a + e), b - a)
                with dctx.stream_reader(frame, read_size=READ_SIZE, read_across_frames=False, closefd=False) as r:
                    while n := r.readinto(buf):
                        done += n
                        yield memoryview(buf)[:n]
            except zstandard.ZstdError as e:
                raise FormatError(path, a, f"corrupt zstd frame {i}, at decoded byte {plain[-1] + done} or before: "
                                  f"{e}") from None
            if sizes[i] >= 0 and done != sizes[i]:
                raise FormatError(path, a, f"zstd frame {i} decodes to {done} bytes, its header says {sizes[i]}")
            plain.append(plain[-1] + done)
            if progress is not None:
                progress(b)
        got.append(Restarts(ZSTD, np.array(plain, np.int64), starts, ends, np.zeros(0, np.uint8)))

    return steps(), lambda: got[0]


# --------------------------------------------------------------------------- random access

_open: "weakref.WeakSet[GzipDecoder]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """rapidgzip aborts the interpreter at exit if one of its files is still open."""
    for d in list(_open):
        d.close()


class GzipDecoder:
    """Reads decoded bytes of a gzip file from anywhere, by rapidgzip with the file's index.
    One read at a time (the caller locks).  ``raw``: the file, or a descriptor of it that the
    decoder owns (read by rapidgzip's own preads, without the GIL).

    Every call into rapidgzip runs on the decoder's own thread: its allocator (rpmalloc) keeps a
    heap per calling thread, about 20 MB each once a few chunks are decoded, so reads from the
    daemon's worker threads, a different one for each load, left one such heap per thread
    (measured: 4 threads reading through one decoder, 131 MB; the same reads on its thread, 69)."""

    def __init__(self, raw: io.RawIOBase | int, restarts: Restarts) -> None:
        self._fd = raw if isinstance(raw, int) else -1
        self._f = None
        self._thread: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="shufflefs-gzip")
        _open.add(self)
        try:
            self._f = self._on_thread(self._open, raw, restarts)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open(raw: io.RawIOBase | int, restarts: Restarts) -> object:
        import rapidgzip

        f = rapidgzip.RapidgzipFile(raw, parallelization=1, chunk_size=GZIP_SPACING)
        try:
            f.import_index(io.BytesIO(restarts.blob.tobytes()))
        except BaseException:
            f.close()
            raise
        return f

    def _on_thread(self, fn: Callable, *args: object) -> object:
        thread = self._thread
        if thread is None:
            raise ValueError("gzip decoder closed")
        return thread.submit(fn, *args).result()

    def read_runs(self, runs: list[tuple[int, memoryview]]) -> None:
        """Fill each ``out`` with the decoded bytes from its ``start``, on the decoder's thread in
        one hand-over; EOFError if the stream ends first."""
        self._on_thread(lambda f: [self._read_into(f, start, out) for start, out in runs], self._f)

    @staticmethod
    def _read_into(f: object, start: int, out: memoryview) -> None:
        f.seek(start)
        read_full(f, out, lambda done: f"the decoded stream ended at {start + done}")

    def close(self) -> None:
        f, self._f = getattr(self, "_f", None), None
        thread, self._thread = getattr(self, "_thread", None), None
        _open.discard(self)
        if f is not None:
            try:
                thread.submit(f.close).result() if thread is not None else f.close()
            except RuntimeError:  # no new work at interpreter exit: close it here
                f.close()
        if thread is not None:
            thread.shutdown(wait=True)
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)  # rapidgzip leaves a descriptor it was given open


class DecodedReader:
    """``read(start, end)`` of a compressed file's decoded bytes, given ``raw(start, end)`` of its
    compressed bytes (``raw_size`` of them) and its restart points; the decoder is made on first
    use and kept until `close`.  A decode error is the file's change if ``verify`` says so (it
    raises `StaleSourceError`), else a `FormatError` naming ``path``: never bytes."""

    def __init__(self, restarts: Restarts, raw: Read, raw_size: int, path: str,
                 verify: Callable[[], None] | None = None, fd: int = -1) -> None:
        """``fd``: the file's descriptor, if it has one (each decoder reads a duplicate of it by
        preads of its own; ``verify`` after the reads tells a changed file)."""
        self.restarts, self.raw, self.path, self.verify = restarts, raw, path, verify
        self.raw_size = restarts.end(raw_size)  # a gzip stream's zero padding is not read...
        self.padded = self.raw_size != raw_size  # ...so neither is the file by rapidgzip's own preads
        self.fd = fd
        self.fill: Fill | None = None  # a zstd file's copy being filled, set by the source that takes the reader
        self.heads: FrameHeads | None = None  # a zstd file version's kept frame starts, likewise
        self.decoder: GzipDecoder | ZstdDecoder | None = None
        self._busy = threading.Lock()  # held while decoding: `_recent` closes idle decoders only

    def into(self, start: int, out: memoryview) -> None:
        """Fill ``out`` with decoded bytes from ``start`` (one thread at a time)."""
        self.into_packed(out, [start], [start + len(out)])

    def into_packed(self, buf: memoryview, starts: list[int], ends: list[int]) -> None:
        """Fill ``buf`` with the decoded bytes ``[starts[k], ends[k])`` back to back (ascending,
        disjoint: a window's runs); a zstd decoder fills them last first, decoding frames straight
        into ``buf`` (`zstd_decode.ZstdDecoder.read_packed`)."""
        with self._busy:
            self._into(buf, starts, ends)
        _recent(self)

    def _into(self, buf: memoryview, starts: list[int], ends: list[int]) -> None:
        try:
            if self.decoder is None:
                own = os.dup(self.fd) if self.fd >= 0 and not self.padded else -1
                raw: Read = lambda a, b: self.raw(a, b)  # noqa: E731 -- the source that holds it now
                if self.restarts.codec == GZIP:
                    self.decoder = GzipDecoder(own if own >= 0 else RangeFile(raw, self.raw_size), self.restarts)
                else:
                    self.decoder = ZstdDecoder(raw, self.restarts, own)
            if isinstance(self.decoder, ZstdDecoder):
                self.decoder.fill, self.decoder.heads = self.fill, self.heads
                self.decoder.read_packed(buf, starts, ends)
            else:
                runs, pos = [], 0
                for s, e in zip(starts, ends):
                    runs.append((s, buf[pos: pos + e - s]))
                    pos += e - s
                self.decoder.read_runs(runs)
        except Exception as e:  # noqa: BLE001 -- the libraries' errors: ValueError, RuntimeError, ZstdError...
            self.close()  # a decoder that failed is not trusted with the next read
            if self.verify is not None:
                self.verify()  # the file changed under the decoder: that is the error
            if isinstance(e, (ShuffleError, OSError)):
                raise
            start, end = (starts[0], ends[-1]) if starts else (0, 0)
            raise FormatError(self.path, None, f"corrupt {self.restarts.codec} stream reading decoded bytes "
                              f"{start}-{end}: {e}") from None

    def __call__(self, start: int, end: int) -> bytes:
        out = bytearray(max(0, end - start))
        self.into(start, memoryview(out))
        return bytes(out)

    def close(self) -> None:
        d, self.decoder = self.decoder, None
        if d is not None:
            d.close()

    def idle_close(self) -> None:
        """Close the decoder unless it is decoding now (it is made again when next needed)."""
        if self._busy.acquire(blocking=False):
            try:
                self.close()
            finally:
                self._busy.release()


DECODERS_KEPT = 32
"""Decoders kept open across the daemon (each holds its file's restart points, about 4 MB per GiB
decoded for gzip, and a few decoded chunks): a pool of many compressed shards keeps the ones read
last, and the others make theirs again when read (the index of a GiB imports in about 70 ms)."""
_readers: "OrderedDict[int, weakref.ref[DecodedReader]]" = OrderedDict()
_readers_lock = threading.Lock()


def _recent(reader: DecodedReader) -> None:
    """``reader`` was used last; close the decoders of the least recently used beyond the bound."""
    with _readers_lock:
        _readers.pop(id(reader), None)
        _readers[id(reader)] = weakref.ref(reader)
        older = [ref() for ref in list(_readers.values())[:-DECODERS_KEPT]]
        for key in list(_readers)[:-DECODERS_KEPT]:
            del _readers[key]
    for r in older:
        if r is not None:
            r.idle_close()
