"""Line-oriented text: JSON Lines, plain text, CSV (quote-aware) and TSV.

A record is one line including its terminating ``\\n`` (so a ``\\r\\n`` ending stays inside the
record).  Lone ``\\r`` line endings are not recognised.  Optional header lines are kept first in
every view.  A last line without a newline is still a record, a *torn* one (a line still being
written, or a file saved without a final newline): views keep it out of the shuffle and give it
last, unchanged, so no reader meets a half-written line in the middle of a view
(`index.table.RecordIndex.torn`).

File shapes that have fewer lines than the header (with ``h`` header lines, ``k`` complete
lines and possibly an unterminated tail ``t``):

* ``k >= h``: the first ``h`` lines are the header, the rest are records.
* ``k < h`` and no tail: the whole file is header, there are no records.
* ``k < h`` with a tail: the complete lines are the header and the tail is the single record
  (e.g. a CSV holding only a header row without its newline), given after the header as in the
  file.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..index.table import RecordIndex
from .base import (SCAN_CHUNK, Format, Progress, Read, WindowCheck, as_bytes, bad_index, framing_error,
                   iter_chunks, window_ends)

NEWLINE = 0x0A
QUOTE = 0x22


def _check_header_lines(header_lines: int) -> int:
    if isinstance(header_lines, bool) or not isinstance(header_lines, (int, np.integer)) or header_lines < 0:
        raise ValueError(f"header_lines must be a non-negative integer, got {header_lines!r}")
    return int(header_lines)


def record_ends(
    data: np.ndarray, progress: Progress | None = None, quote_aware: bool = False, chunk: int = SCAN_CHUNK,
    quotes: int = 0,
) -> tuple[np.ndarray, int]:
    """Offsets just past every record-ending newline, and the number of quote bytes seen.

    With ``quote_aware`` a newline ends a record only when an even number of ``"`` bytes precede
    it (RFC 4180: quoted fields may hold newlines; an escaped quote ``""`` counts twice).
    ``quotes``: the quotes seen before ``data`` (a stream scanned piece by piece), counted in.
    """
    buf = np.empty(min(chunk, len(data)), dtype=bool)
    parts = []
    for start, piece in iter_chunks(data, progress, chunk):
        mask = buf[: len(piece)]
        np.equal(piece, NEWLINE, out=mask)
        nl = np.flatnonzero(mask)
        if quote_aware:
            np.equal(piece, QUOTE, out=mask)
            q = np.flatnonzero(mask)
            if len(q):
                before = np.searchsorted(q, nl) + quotes
                nl = nl[(before & 1) == 0]
            elif quotes & 1:
                nl = nl[:0]
            quotes += len(q)
        nl = nl.astype(np.int64, copy=False)
        nl += start + 1
        parts.append(nl)
    ends = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ends, quotes


def lines_index(ends: np.ndarray, size: int, header_lines: int) -> RecordIndex:
    """Lay out records from the record ends (see the module docstring for short files)."""
    k = len(ends)
    last_end = int(ends[-1]) if k else 0
    tail = size > last_end
    kept = min(header_lines, k)
    header_end = int(ends[kept - 1]) if kept else 0
    pieces = [np.array([header_end], dtype=np.int64), ends[header_lines:]]
    if tail:
        pieces.append(np.array([size], dtype=np.int64))
    return RecordIndex(size, np.concatenate(pieces), add_newline=tail)


def check_lines(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """Every record of a gathered window ends in ``\\n`` but a torn one (`RecordIndex.torn`),
    which must not (before the newline it may gain in the view): O(records), the bytes of the
    window are not read."""
    ids = np.asarray(ids, np.int64)
    if not len(ids):
        return
    ends = window_ends(window, ids, index, path)
    bad = window[ends - 1] != NEWLINE
    torn = ids >= index.n - index.torn
    if torn.any():
        nl = index.newline_ids
        gains = np.isin(ids, nl) if len(nl) else np.zeros(len(ids), bool)
        own = ends - 1 - gains  # a torn record's own last byte
        bad[torn] = (window[own] == NEWLINE)[torn] | (gains[torn] & bad[torn])
    if bad.any():
        raise framing_error(path, index, ids, bad, "a line does not end where the record does")


def check_rows(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """`check_lines`, and every record holds an even number of ``"`` (it ends outside quotes).
    Reads every byte of the window: about `SCAN_CHUNK` bytes of records at a time, compared
    with ``"`` and reduced per record by XOR (parity only, no positions)."""
    check_lines(window, ids, index, path)
    ids = np.asarray(ids, np.int64)
    if not len(ids):
        return
    ends = window_ends(window, ids, index, path)
    starts = np.concatenate((np.zeros(1, np.int64), ends[:-1]))
    cuts = np.unique(np.searchsorted(starts, np.arange(0, int(ends[-1]), SCAN_CHUNK), side="right") - 1)
    cuts = np.append(cuts, len(ids))
    buf = np.empty(0, bool)
    odd = np.zeros(len(ids), bool)
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        lo, hi = int(starts[r0]), int(ends[r1 - 1])
        if len(buf) < hi - lo:
            buf = np.empty(max(hi - lo, SCAN_CHUNK), bool)
        mask = np.equal(window[lo:hi], QUOTE, out=buf[: hi - lo])
        odd[r0:r1] = np.bitwise_xor.reduceat(mask.view(np.uint8), starts[r0:r1] - lo).view(bool)
    if odd.any():
        raise framing_error(path, index, ids, odd, "a row ends inside a quoted field")


def check_lines_index(index: RecordIndex, read: Read, path: str, header_lines: int, quoted: bool) -> None:
    """A line index ends with the file, adds a newline exactly when the file lacks a final one,
    and keeps ``header_lines`` whole lines (rows, for CSV) first."""
    size, head_end = index.size, index.header_end
    if index.trailer_start != size:
        raise bad_index(path, index.trailer_start, "the records end before the file does")
    if index.add_newline != (size > 0 and read(size - 1, size) != b"\n"):
        raise bad_index(path, size, "the index disagrees with the file's last byte")
    head = np.frombuffer(read(0, head_end), np.uint8)
    if len(head) and head[-1] != NEWLINE:
        raise bad_index(path, head_end, "the header does not end a line")
    rows, quotes = record_ends(head, quote_aware=quoted)
    if quotes & 1:
        raise bad_index(path, head_end, "the header ends inside a quoted field")
    if len(rows) > header_lines or (len(rows) < header_lines and index.n > int(index.add_newline)):
        raise bad_index(path, head_end, f"the header holds {len(rows)} lines, not {header_lines}")


class LinesFormat(Format):
    """Newline-terminated records (``.jsonl``, ``.ndjson``, ``.txt``; ``.tsv`` with one header line).

    TSV has no quoting convention that could put a newline inside a field, so plain lines with
    ``header_lines=1`` are exact for it.
    """

    name = "lines"
    framing = "lines"
    extensions = {".jsonl": {}, ".ndjson": {}, ".txt": {}, ".tsv": {"header_lines": 1}}

    def __init__(self, header_lines: int = 0) -> None:
        self.header_lines = _check_header_lines(header_lines)

    def params(self) -> dict:
        return {"header_lines": self.header_lines}

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        data = as_bytes(data)
        ends, _ = record_ends(data, progress)
        return lines_index(ends, len(data), self.header_lines)

    def frame_check(self) -> WindowCheck | None:
        return check_lines

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        check_lines_index(index, read, path, self.header_lines, quoted=False)


class CsvFormat(LinesFormat):
    """RFC 4180 CSV: like lines with one header line, but a quoted field may span lines.

    Quotes are counted from the start of the file, so a stray ``"`` inside an unquoted field
    (not valid RFC 4180) merges the following lines into one record or, at the end of the file,
    is reported as an unterminated quote.  Either way the view still holds exactly the source
    bytes.
    """

    name = "csv"
    framing = "rows"
    extensions = {".csv": {}}

    def __init__(self, header_lines: int = 1) -> None:
        super().__init__(header_lines)

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        data = as_bytes(data)
        ends, quotes = record_ends(data, progress, quote_aware=True)
        if quotes & 1:
            start = int(ends[-1]) if len(ends) else 0
            raise FormatError(path, start, "unterminated quoted field in the record starting here")
        return lines_index(ends, len(data), self.header_lines)

    def frame_check(self) -> WindowCheck | None:
        return check_rows  # a bound at a newline inside quotes ends a record in a newline too

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        check_lines_index(index, read, path, self.header_lines, quoted=True)


FORMATS = (LinesFormat, CsvFormat,)
"""The formats this module adds to the registry (`shufflefs.formats.MODULES`)."""
