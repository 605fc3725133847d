"""Compressed text: JSON lines, text, CSV and TSV in gzip (``.jsonl.gz``, ``.json.gz``, ``.csv.gz``,
``.txt.gz``, ...) or zstd (``.jsonl.zst``, ...) files, shuffled record by record.

A compressed file's records are the lines (or CSV rows) of its decoded bytes, with every rule of
the plain line formats (header lines kept first, a last line without its newline kept last).
Its index (`index.decoded.DecodedIndex`) is built by decoding the file once, a few MiB at a time
(`codecs.decode_all`), and scanning the decoded steps for record ends as a plain file is scanned;
it keeps the file's restart points.  Its view is the plain view of those records served in a
container of the same codec that compresses nothing (`windows.container`, by `Format.codec`): a
valid ``.gz`` or ``.zst`` at the same path, whose size follows from the decoded size, so the view
is sized when it is planned (`planned_size`).  Window checks are the plain line formats' (on
decoded bytes).

The codecs' libraries are optional: a file of a codec whose library is missing passes through
unchanged (`available`), with a log line once.
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, ClassVar, Iterator

import numpy as np

from ..errors import FormatError, StaleSourceError
from ..index.decoded import DecodedIndex, Restarts
from ..index.table import RecordIndex
from . import codecs
from .base import Format, Progress, Read
from .lines import CsvFormat, LinesFormat, lines_index, record_ends

TEXT = (".jsonl", ".ndjson", ".json", ".txt")
"""Text suffixes whose compressed files are JSON lines or text (``.json.gz``: C4's and the Pile's
JSON lines)."""


@dataclass(frozen=True)
class CopyTarget:
    """Where a scan writes the decoded bytes it decodes anyway: the mount's decoded copy of the
    file (`stages.decoded`), made by the scan instead of a second decode.  ``keep_free``: free
    bytes the disk keeps; the writing stops short of them (its partial file removed), the scan
    goes on."""

    path: str
    keep_free: int


class StepWriter:
    """Decoded steps (a callable per step) written to ``file`` by a thread of its own, so that
    writing overlaps decoding instead of adding to it (on a 2-core VM, a 1 GiB copy written in
    line added 1.0 s to a scan of 2-3 s).  Past the first error, or where the disk would keep less
    than ``keep_free`` bytes (looked at every `CHECK_EVERY`), the rest is dropped: ``stopped``
    says why, ``error`` is the write's error."""

    CHECK_EVERY = 64 << 20
    """Bytes written between looks at the disk's free space."""
    QUEUED = 2
    """Steps waiting to be written (each `codecs.DECODE_STEP` bytes)."""

    def __init__(self, file: BinaryIO | None, where: str, keep_free: int = 0) -> None:
        self.file, self.where, self.keep_free = file, where, keep_free
        self.stopped: str | None = None
        self.error: OSError | None = None
        self._queue: queue.Queue[tuple[bytearray, int] | None] = queue.Queue(self.QUEUED)
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()  # buffers written, for the next steps
        for _ in range(self.QUEUED + 1):
            self._free.put(bytearray())
        self._thread: threading.Thread | None = None
        if file is not None:
            self._thread = threading.Thread(target=self._write, name="step-writer", daemon=True)
            self._thread.start()

    def __call__(self, step: memoryview) -> None:
        if self.stopped is None and self._thread is not None:
            buf, n = self._free.get(), len(step)  # a step is valid only until the next: copied
            if len(buf) < n:
                buf = bytearray(n)
            buf[:n] = step
            self._queue.put((buf, n))

    def _write(self) -> None:
        unchecked = 0
        while (got := self._queue.get()) is not None:
            buf, n = got
            try:
                if self.stopped is not None or self.file is None:
                    continue  # the rest is dropped
                if unchecked + n > self.CHECK_EVERY:
                    st = os.statvfs(self.where)
                    if st.f_bavail * st.f_frsize < self.keep_free + n:
                        self.stopped = f"the disk would keep less than {self.keep_free:,} free bytes"
                        continue
                    unchecked = 0
                self.file.write(memoryview(buf)[:n])
                unchecked += n
            except OSError as e:
                self.stopped, self.error = str(e), e
            finally:
                self._free.put(buf)

    def close(self) -> None:
        """Once every step queued is written (or dropped)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class CopyWriter(StepWriter):
    """The decoded steps of a scan written to a `CopyTarget`; a copy stopped short is removed."""

    def __init__(self, target: CopyTarget) -> None:
        self.target = target
        why = None
        try:
            file: BinaryIO | None = open(target.path, "wb")
        except OSError as e:
            file, why = None, str(e)
        super().__init__(file, target.path, target.keep_free)
        self.stopped = why

    def stop(self, why: str) -> None:
        """No copy (the scan failed): the partial file removed."""
        self.stopped = self.stopped or why
        self.close()

    def close(self) -> None:
        super().close()
        if self.file is not None:
            f, self.file = self.file, None
            try:
                f.close()
            except OSError as e:
                self.stopped = self.stopped or str(e)
        if self.stopped is not None:
            try:
                os.unlink(self.target.path)
            except OSError:
                pass


READ_STEP = 1 << 20
"""Compressed bytes a background copy of a gzip file reads at a time."""


def inflate(read: Callable[[int, int], Any], size: int, path: str) -> Iterator[bytes]:
    """A gzip file's decoded bytes by zlib, member after member, every member's CRC-32 and length
    checked: what a background copy decodes with.  It holds a few hundred KiB, where rapidgzip
    (`formats.codecs.decode_all`) keeps a heap of about 20 MB for every thread that calls it.
    A damaged or truncated stream is `FormatError` at the compressed offset reached."""
    d, begun, pos = zlib.decompressobj(31), False, 0
    while pos < size:
        data = bytes(read(pos, min(size, pos + READ_STEP)))
        if not data:
            raise StaleSourceError(path, pos, "the file ends before its indexed size")
        pos += len(data)
        while data:
            if not begun:  # between members: zero bytes are padding, as gzip and Python's gzip take them
                data = data.lstrip(b"\0")
                if not data:
                    break
            begun = True
            try:
                out = d.decompress(data, codecs.DECODE_STEP)
            except zlib.error as e:
                raise FormatError(path, pos, f"corrupt gzip stream before this offset: {e}") from None
            if out:
                yield out
            if d.eof:
                data, d, begun = d.unused_data, zlib.decompressobj(31), False
            else:
                data = d.unconsumed_tail
    while begun and not d.eof:  # what the last input left inside the decoder
        out = d.decompress(b"", codecs.DECODE_STEP)
        if not out:
            raise FormatError(path, size, "the gzip stream is truncated")
        yield out


def scan_decoded(codec: str, data: np.ndarray, path: str, header_lines: int, quoted: bool,
                 progress: Progress | None = None, copy: CopyTarget | None = None) -> DecodedIndex:
    """The index of a compressed file from its bytes (mapped): record ends found step by step
    in its decoded bytes (a CSV's quote parity carried across steps), with its restart points;
    the decoded bytes also written to ``copy`` if given."""
    steps, restarts = codecs.decode_all(codec, *codecs.buffer_read(data), path, progress)
    writer = None if copy is None else CopyWriter(copy)
    try:
        return _scan_steps(steps, restarts, path, header_lines, quoted, writer)
    except BaseException:
        if writer is not None:
            writer.stop("the scan failed")
        raise
    finally:
        if writer is not None:
            writer.close()


def _scan_steps(steps: Iterator[memoryview], restarts: Callable[[], Restarts], path: str, header_lines: int,
                quoted: bool, sink: Callable[[memoryview], None] | None) -> DecodedIndex:
    parts, base, quotes = [], 0, 0
    last = None
    for step in steps:
        if sink is not None:
            sink(step)
        arr = np.frombuffer(step, np.uint8)
        ends, quotes = record_ends(arr, quote_aware=quoted, quotes=quotes)
        ends += base
        parts.append(ends)
        base += len(arr)
        last = int(arr[-1]) if len(arr) else last
    if quoted and quotes & 1:
        start = int(parts[-1][-1]) if parts and len(np.concatenate(parts)) else 0
        raise FormatError(path, None, f"unterminated quoted field in the record starting at decoded byte {start}")
    ends = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    index = lines_index(ends, base, header_lines)
    return DecodedIndex(index.size, index.bounds, index.add_newline, None, restarts())


def decoded_bytes(path: str | os.PathLike, fmt: Format) -> np.ndarray:
    """A compressed file's decoded bytes, whole, in memory (for ``shufflefs inspect``)."""
    data = np.fromfile(os.fspath(path), dtype=np.uint8)
    steps, _ = codecs.decode_all(fmt.codec, *codecs.buffer_read(data), os.fspath(path))
    return np.frombuffer(b"".join(bytes(step) for step in steps), np.uint8)


class Decoded:
    """What the compressed formats share (mixed into the plain line formats)."""

    codec: ClassVar[str]
    planned_size: ClassVar[bool] = True
    header_lines: int

    @classmethod
    def available(cls) -> str | None:
        """None if this codec's library can be imported, else what is missing."""
        return codecs.missing(cls.codec)

    @property
    def plain_name(self) -> str:
        """The line format of the decoded bytes (``lines``, ``csv``)."""
        return CsvFormat.name if isinstance(self, CsvFormat) else LinesFormat.name

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None,
             copy: CopyTarget | None = None) -> RecordIndex:
        return scan_decoded(self.codec, data, path, self.header_lines, isinstance(self, CsvFormat), progress, copy)

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """The line formats' check, on decoded bytes.  A file without restart points worth using
        (one zstd frame) is only checked at its start: its last byte would need the whole file
        decoded, and every record's end is checked as its window is gathered anyway."""
        if not isinstance(index, DecodedIndex):
            raise FormatError(path, None, "the index of a compressed file lacks its restart points")
        if index.staged:
            head = index.header_end
            data = np.frombuffer(read(0, head), np.uint8)
            if len(data) and data[-1] != 0x0A:
                raise FormatError(path, head, "the header does not end a line: the index does not fit the file")
            return
        super().check_index(index, read, path)  # type: ignore[misc]

    def _require(self) -> None:
        lacking = self.available()
        if lacking is not None:
            raise ValueError(f"{self.codec} files need {lacking}: pip install 'shufflefs[compressed]'")


def _extensions(codec_suffix: str, csv: bool) -> dict[str, dict]:
    if csv:
        return {".csv" + codec_suffix: {}}
    return {**{t + codec_suffix: {} for t in TEXT}, ".tsv" + codec_suffix: {"header_lines": 1}}


class GzipLinesFormat(Decoded, LinesFormat):
    """JSON lines or text in a gzip file (``.jsonl.gz``, ``.json.gz``, ``.ndjson.gz``, ``.txt.gz``,
    ``.tsv.gz``)."""

    name = "lines-gzip"
    codec = codecs.GZIP
    extensions = _extensions(".gz", False)

    def __init__(self, header_lines: int = 0) -> None:
        super().__init__(header_lines)
        self._require()


class GzipCsvFormat(Decoded, CsvFormat):
    """CSV in a gzip file (``.csv.gz``)."""

    name = "csv-gzip"
    codec = codecs.GZIP
    extensions = _extensions(".gz", True)

    def __init__(self, header_lines: int = 1) -> None:
        super().__init__(header_lines)
        self._require()


class ZstdLinesFormat(Decoded, LinesFormat):
    """JSON lines or text in a zstd file (``.jsonl.zst``, ``.json.zst``, ...)."""

    name = "lines-zstd"
    codec = codecs.ZSTD
    extensions = _extensions(".zst", False)

    def __init__(self, header_lines: int = 0) -> None:
        super().__init__(header_lines)
        self._require()


class ZstdCsvFormat(Decoded, CsvFormat):
    """CSV in a zstd file (``.csv.zst``)."""

    name = "csv-zstd"
    codec = codecs.ZSTD
    extensions = _extensions(".zst", True)

    def __init__(self, header_lines: int = 1) -> None:
        super().__init__(header_lines)
        self._require()


FORMATS = (GzipLinesFormat, GzipCsvFormat, ZstdLinesFormat, ZstdCsvFormat)
"""The formats this module adds to the registry (`shufflefs.formats.MODULES`)."""
