"""The framing check of every gathered window: each record is one whole record of its format.

An index from the cache or from a published index is a hint: a checksum says it is whole, not
that it is this file's, and anyone who can write a shared index directory or a bucket prefix can
write a whole, checksummed entry.  Checking only that each record *ends* where its format ends
one lets such an entry merge records (every second bound of a JSON-lines file dropped: each
remaining bound still ends a line) or split them, and so change the record count.  So each
record is checked whole, every byte, as the compiled gather copies it (``_gather.c``, without the
GIL; the checks are in ``_framing.c``): a line holds exactly one newline, its last byte (none in a
line that ends its file without one); a CSV row the same, counting newlines outside quotes only;
a TFRecord frame's length field is its length; a tar sample is a chain of whole members with one
sample key, and one sample of a scan of its file: the sample before it in the file ends with a
keyed member of another key, and after it come the end of the archive or a keyed member of
another key (members of no key travel with the sample after them).  That takes bytes outside
the window: the compiled gather reads them from the file (a mapping, or a few preads per run of
samples), and a window built from fetched ranges is checked by `check_pieces` over the ranges
`windows.edges` fetches with it.  Records whose bounds pass these are the records a scan of the
file finds, so a wrong index is `FramingError` (EIO, the index dropped and built from the file),
never other records.

Without the compiled module, `fallback` does the same in numpy (and, for tar, one scan per
sample, `tar_walk` for the neighbours: slow, but only a build without a compiler gets there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError
from ..index.table import RecordIndex
from .base import FRAMING_ENV, Format, FramingError, WindowCheck, framing_error, window_ends

try:
    from .. import _gather  # compiled at install time; optional
except ImportError:  # pragma: no cover - depends on the build
    _gather = None

NEWLINE, QUOTE, BLOCK = 0x0A, 0x22, 512


@dataclass(frozen=True)
class FramingCheck:
    """The check of every window of a view.  ``kind`` (`Format.framing`) runs inside the
    compiled gather as each record is copied (`windows.view.View.load_window` passes `code`);
    ``full`` (TFRecord CRCs, ``--verify frames``) on the window after it.  Called as a
    `WindowCheck` (a window built without the compiled gather: a remote source), it runs both
    over the window alone (a tar window's neighbours in its files: `check_pieces`)."""

    kind: str | None
    fallback: WindowCheck | None
    """The framing check in numpy, where the compiled module is missing."""
    full: WindowCheck | None = None

    @property
    def code(self) -> int:
        """``kind`` for the compiled gather (0: none, or no compiled module)."""
        if self.kind is None or _gather is None:
            return 0
        return _gather.FRAMING_KINDS.index(self.kind)

    def __call__(self, window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
        self.frame(window, ids, index, path)
        if self.full is not None:
            self.full(window, ids, index, path)

    def frame(self, window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
        """The framing check alone, over a window built elsewhere (compiled, or `fallback`)."""
        if self.code:
            ids = np.ascontiguousarray(ids, np.int64)
            report = np.empty(2, np.int64)
            keys = np.empty(len(ids), np.uint64) if self.kind == "tar" else None
            args = (window, self.code, index.bounds, ids, index.newline_ids, report, unterminated(index))
            _gather.check_window(*args, *(() if keys is None else (keys,)))
            raise_framing(report, index, path)
            if keys is not None:
                neighbours(keys, ids, index, path)
        elif self.fallback is not None:
            self.fallback(window, ids, index, path)


def gather_check(fmt: Format, verify: str) -> FramingCheck | None:
    """The check a view of ``fmt`` runs on every window: its framing, and with ``--verify
    frames`` the full one (none when `FRAMING_ENV` is ``off``)."""
    if os.environ.get(FRAMING_ENV, "").lower() == "off":
        return None
    full = fmt.window_check() if verify == "frames" else None
    if fmt.framing is None and full is None:
        return None
    return FramingCheck(fmt.framing, fallback(fmt.framing, fmt.frame_check()), full)


def unterminated(index: RecordIndex) -> np.ndarray:
    """The records of ``index`` that are lines without their newline (the last of their file):
    the only ones the framing check lets end without one."""
    ids = getattr(index, "unterminated_ids", None)
    return np.ascontiguousarray(index.newline_ids if ids is None else ids, np.int64)


def raise_framing(report: np.ndarray, index: RecordIndex, path: str) -> None:
    """The `FramingError` of a compiled check's ``report`` (record id, reason), if it has one."""
    rid, why = int(report[0]), int(report[1])
    if why:
        raise framing_failure(index, path, rid, _gather.FRAMING_REASONS[why])


def framing_failure(index: RecordIndex, path: str, rid: int, reason: str) -> FramingError:
    """The error of record ``rid`` found wrong for ``reason``."""
    return FramingError(path, int(index.bounds[rid]), f"{reason} at record {rid}: the index does not fit the file "
                        "(a wrong cache entry or published index, or the file changed after it was indexed); it "
                        "is rebuilt")


TAR = _gather.FRAMING_KINDS.index("tar") if _gather is not None else -1
"""The compiled gather's code of the tar check (-1 without the compiled module)."""


def check_pieces(bufs: tuple, pieces: tuple[np.ndarray, ...], sizes: np.ndarray, bounds: np.ndarray,
                 runs: tuple[np.ndarray, ...], whole: bool, need: np.ndarray, seen: tuple | None = None
                 ) -> tuple[int, str] | None:
    """Runs of tar samples and their neighbours in their files, read from ``pieces`` (buffer,
    file, start, end, position: int64 arrays sorted by file and start; file f has ``sizes[f]``
    bytes) of ``bufs``; ``runs``: first, count, file, shift, pred, recend (see ``check_pieces`` in
    ``_edges.c``).  The first failure as ``(record id, reason)``, else None; ``need`` (int64[runs,
    3]) gets ``(file, offset, length)`` of what each run still misses (file -1: done).  ``seen``:
    the samples walked before (``_edges.c``; the Python walk reads all from the pieces)."""
    if _gather is None:
        from .tar_walk import check_pieces as walk

        return walk(bufs, *pieces, sizes, bounds, *runs, whole, need)
    report = np.empty(2, np.int64)
    c = np.ascontiguousarray
    _gather.check_pieces(TAR, bufs, *(c(a, np.int64) for a in (*pieces, sizes, bounds, *runs)), int(whole), report,
                         need, seen)
    return (int(report[0]), _gather.FRAMING_REASONS[int(report[1])]) if report[1] else None


def neighbours(keys: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """No two neighbouring records of a member, both in the window, have one sample key (a tar
    sample cut in two); ``keys``: each record's, in the order of ``ids``."""
    order = np.argsort(ids, kind="stable")
    a, k = ids[order], keys[order]
    pair = np.flatnonzero((a[1:] == a[:-1] + 1) & (k[1:] == k[:-1]))
    firsts = getattr(index, "member_firsts", None)
    if firsts is not None and len(pair):
        pair = pair[~np.isin(a[pair + 1], firsts)]  # the first record of a member: another file
    if len(pair):
        raise_framing(np.array([a[pair[0] + 1], _gather.FRAMING_SPLIT], np.int64), index, path)


# --------------------------------------------------------------------------- numpy fallbacks


def fallback(kind: str | None, ends: WindowCheck | None) -> WindowCheck | None:
    """The framing check of ``kind`` without the compiled module: the format's check of record
    ends (`Format.frame_check`), then what makes each record whole."""
    whole = {"lines": _whole_lines, "rows": _whole_rows, "tar": _whole_samples}.get(kind or "")
    if ends is None or whole is None:
        return ends

    def check(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
        ends(window, ids, index, path)
        ids = np.asarray(ids, np.int64)
        if len(ids):
            whole(window, ids, index, path)

    return check


def _newlines(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str, quoted: bool) -> None:
    """Every newline of the window (outside quotes, counted from each record's start) is the last
    byte of its record."""
    ends = window_ends(window, ids, index, path)
    starts = ends - index.out_lengths(ids)
    body = window[: int(ends[-1])]
    nl = np.flatnonzero(body == NEWLINE)
    rec = np.searchsorted(ends, nl, side="right")
    if quoted:
        q = np.flatnonzero(body == QUOTE)
        outside = ((np.searchsorted(q, nl) - np.searchsorted(q, starts[rec])) & 1) == 0
        nl, rec = nl[outside], rec[outside]
    last = nl == ends[rec] - 1
    open_ = np.isin(ids[rec], unterminated(index)) & ~np.isin(ids[rec], index.newline_ids)
    wrong = ~last | open_  # inside a record, or a line without its newline that has one
    if wrong.any():
        bad = np.zeros(len(ids), bool)
        bad[rec[wrong]] = True
        raise framing_error(path, index, ids, bad, "a newline inside a record")


def _whole_lines(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    _newlines(window, ids, index, path, quoted=False)


def _whole_rows(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    _newlines(window, ids, index, path, quoted=True)


def _whole_samples(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """Every sample scanned as a tar of its own is one sample, and two neighbours of a member in
    the window are two."""
    from .tar import TarFormat

    fmt, tail = TarFormat(), np.zeros(2 * BLOCK, np.uint8)
    ends = window_ends(window, ids, index, path)
    starts = ends - index.record_lengths(ids)

    def samples(*parts: np.ndarray) -> int:
        data = np.concatenate((*parts, tail))
        try:
            scanned = fmt.scan(data, path)
        except FormatError:
            return -1
        return scanned.n if scanned.trailer_start == len(data) - len(tail) else -1

    rec = [window[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
    bad = np.array([samples(r) != 1 for r in rec])
    if bad.any():
        raise framing_error(path, index, ids, bad, "not one whole sample")
    order = np.argsort(ids, kind="stable")
    a = ids[order]
    firsts = getattr(index, "member_firsts", np.zeros(1, np.int64))
    for p in np.flatnonzero((a[1:] == a[:-1] + 1) & ~np.isin(a[1:], firsts)).tolist():
        if samples(rec[order[p]], rec[order[p + 1]]) != 2:
            bad[order[p + 1]] = True
            raise framing_error(path, index, ids, bad, "the next record has the same sample key (one sample cut "
                                "in two)")
