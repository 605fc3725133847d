"""Tar samples checked against their neighbours in their files, in Python: what the compiled
``check_pieces`` (``_edges.c`` with ``_framing.c``) does, for a build without the compiled module.

A record is one sample of a scan of its file when it is a chain of whole members with one sample
key (members of no key, such as directories, travel with the sample after them), the sample
before it in its file ends with a keyed member of another key (or, for a file's first sample,
it starts with a keyed member: what precedes it is the file's header), and after it come the end
of the archive or a keyed member of another key.  The bytes are read from *pieces*: ranges of
files held in buffers, fetched beforehand; a run whose bytes are not all at hand is left with
the range it needs next.  Slow (a Python loop over members), but only a build without a compiler
gets here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 512
REASONS = {
    "partial": "a sample of part of a 512-byte block",
    "header": "no tar header where a member must start",
    "overrun": "a member runs past the end of its sample",
    "two keys": "two sample keys in one record",
    "no key": "no sample key in a record",
    "split": "the next record has the same sample key (one sample cut in two)",
    "meta last": "an extended header with no member after it",
    "sparse": "a GNU sparse member",
    "size": "a tar size field that is not a number",
    "keyless end": "a sample ends with members of no sample key while another sample follows (they are the next "
                   "one's)",
    "keyless first": "a file's first sample starts with members of no sample key (they are the file's header)",
    "prev": "the record before it in its file is not one whole sample",
    "no next": "neither a tar header nor the end of the archive after a sample",
    "eof": "the file ends inside a sample or the headers next to it",
}
"""The reasons, worded as the compiled module's (``_gather.FRAMING_REASONS``)."""


class Unread(Exception):
    """Bytes not at hand: ``missing`` (fetch ``[off, off+n)`` of the file), else past its end."""

    def __init__(self, off: int, n: int, missing: bool) -> None:
        super().__init__(off, n)
        self.off, self.n, self.missing = off, n, missing


class Bad(Exception):
    """A reason (a key of `REASONS`)."""


@dataclass
class Sample:
    key: bytes
    first_keyed: bool
    last_keyed: bool


class Pieces:
    """Bytes ``[start[p], end[p])`` of file ``file[p]`` at ``pos[p]`` of ``bufs[buf[p]]``."""

    def __init__(self, bufs: tuple, buf: np.ndarray, file: np.ndarray, start: np.ndarray, end: np.ndarray,
                 pos: np.ndarray, sizes: np.ndarray) -> None:
        self.bufs, self.sizes, self.file = bufs, sizes, 0
        self.rows = sorted(zip(file.tolist(), start.tolist(), end.tolist(), buf.tolist(), pos.tolist()))

    def at(self, off: int, n: int) -> bytes:
        if off < 0 or off + n > int(self.sizes[self.file]):
            raise Unread(off, n, False)
        if n == 0:
            return b""
        for f, s, e, b, p in self.rows:
            if f == self.file and s <= off and off + n <= e:
                return bytes(np.asarray(self.bufs[b])[p + off - s: p + off - s + n])
        raise Unread(off, n, True)


def _octal(f: bytes) -> int | None:
    i = 0
    while i < len(f) and f[i] == 0x20:
        i += 1
    j = i
    while j < len(f) and 0x30 <= f[j] <= 0x37:
        j += 1
    if j == i or (j < len(f) and f[j] not in (0, 0x20)):
        return None
    return int(f[i:j], 8)


def _header_ok(h: bytes) -> bool:
    if h[257:262] != b"ustar":
        return False
    stored = _octal(h[148:156])
    if stored is None:
        return False
    rest = h[:148] + h[156:]
    signed = sum(b - 256 if b > 127 else b for b in rest)
    return stored in (sum(rest) + 8 * 0x20, signed + 8 * 0x20)


def _size(h: bytes) -> int:
    f = h[124:136]
    if f[0] == 0x80:
        if any(f[1:4]) or f[4] >= 0x80:
            raise Bad("size")
        return int.from_bytes(f[4:12], "big")
    v = _octal(f)
    if v is None:
        raise Bad("size")
    return v


def _nul(b: bytes) -> bytes:
    return b.split(b"\0", 1)[0]


def _key(name: bytes) -> bytes | None:
    """webdataset's key: the name up to the first dot of its basename (None: no key)."""
    base = name.rfind(b"/") + 1
    if base >= len(name) or name[base] == 0x2E:
        return None
    dot = name.find(b".", base + 1)
    return name[:dot] if dot > 0 else None


def _pax_path(d: bytes) -> bytes | None:
    pos, path = 0, None
    while pos < len(d):
        i = pos
        while i < len(d) and 0x30 <= d[i] <= 0x39 and i - pos < 13:
            i += 1
        if i == pos or i >= len(d) or d[i] != 0x20 or int(d[pos:i]) <= 0:
            break
        length = int(d[pos:i])
        rec, end = i + 1, min(pos + length - 1, len(d))
        if end - rec >= 5 and d[rec: rec + 5] == b"path=":
            path = d[rec + 5: end]
        pos += length
    return path


def _member(src: Pieces, at: int) -> tuple[bytes, int, int]:
    """The header at ``at``: (header, type flag, blocks of data after it)."""
    h = src.at(at, BLOCK)
    if not _header_ok(h):
        raise Bad("header")
    size, flag = _size(h), h[156]
    if flag == ord("S"):
        raise Bad("sparse")
    return h, flag, 0 if ord("1") <= flag <= ord("6") else -(-size // BLOCK)


def _long_name(src: Pieces, h: bytes, at: int, flag: int, name: list) -> None:
    if flag == ord("K"):
        return
    data = src.at(at + BLOCK, _size(h))
    got = _nul(data) if flag == ord("L") else _pax_path(data)
    if got is not None:
        name[:] = [got]


def _key_of(h: bytes, flag: int, name: list) -> bytes | None:
    if flag not in (ord("0"), ord("7"), 0):
        return None
    if name:
        return _key(name[0])
    if h[262] == 0 and h[345] != 0:
        return _key(_nul(h[345:500]) + b"/" + _nul(h[:100]))
    return _key(_nul(h[:100]))


def sample_at(src: Pieces, start: int, end: int) -> Sample:
    """[start, end) as one whole sample (`Bad`, or `Unread`)."""
    if end < start or (end - start) % BLOCK:
        raise Bad("partial")
    off, key, meta, members, name = start, None, False, 0, []
    first = last = False
    while off < end:
        h, flag, blocks = _member(src, off)
        if blocks > (end - off) // BLOCK - 1:
            raise Bad("overrun")
        if flag in b"LKx":
            _long_name(src, h, off, flag, name)
            meta, off = True, off + BLOCK * (1 + blocks)
            continue
        k = _key_of(h, flag, name)
        if k is not None:
            if key is not None and k != key:
                raise Bad("two keys")
            key = k
        if not members:
            first = k is not None
        members, last, name, meta = members + 1, k is not None, [], False
        off += BLOCK * (1 + blocks)
    if meta:
        raise Bad("meta last")
    if key is None:
        raise Bad("no key")
    return Sample(key, first, last)


def _next(src: Pieces, at: int) -> bytes | str:
    """What follows a sample ending at ``at``: the next keyed member's key, ``"end"`` or
    ``"keyless"`` (members of no key, then the end)."""
    keyless, meta, name = False, False, []
    while True:
        try:
            h = src.at(at, BLOCK)
        except Unread as e:
            if e.missing:
                raise
            h = bytes(BLOCK)
        if not any(h):
            if meta:
                raise Bad("meta last")
            return "keyless" if keyless else "end"
        if not _header_ok(h):
            raise Bad("no next")
        h, flag, blocks = _member(src, at)
        if flag in b"LKx":
            _long_name(src, h, at, flag, name)
            meta, at = True, at + BLOCK * (1 + blocks)
            continue
        k = _key_of(h, flag, name)
        if k is not None:
            return k
        keyless, name, meta, at = True, [], False, at + BLOCK * (1 + blocks)


def _pair(prev: Sample, nxt: Sample) -> None:
    if not prev.last_keyed:
        raise Bad("keyless end")
    if prev.key == nxt.key:
        raise Bad("split")


def _left(src: Pieces, pred: int, start: int, first: Sample) -> None:
    if pred < 0:
        if not first.first_keyed:
            raise Bad("keyless first")
        return
    try:
        prev = sample_at(src, pred, start)
    except Bad:
        raise Bad("prev") from None
    _pair(prev, first)


def _right(src: Pieces, end: int, recend: int, last: Sample) -> None:
    if end == recend:
        return
    got = _next(src, end)
    if got == "end":
        return
    if got == "keyless" or not last.last_keyed:
        raise Bad("keyless end")
    if got == last.key:
        raise Bad("split")


def check_pieces(bufs: tuple, pbuf: np.ndarray, pfile: np.ndarray, pstart: np.ndarray, pend: np.ndarray,
                 ppos: np.ndarray, sizes: np.ndarray, bounds: np.ndarray, first: np.ndarray, count: np.ndarray,
                 file: np.ndarray, shift: np.ndarray, pred: np.ndarray, recend: np.ndarray, whole: bool,
                 need: np.ndarray) -> tuple[int, str] | None:
    """The compiled ``check_pieces`` in Python: the first failure as ``(record id, reason)``, or
    None; ``need`` (int64[runs, 3]) as there."""
    src = Pieces(bufs, pbuf, pfile, pstart, pend, ppos, sizes)
    b = bounds.tolist()
    need[:, 0] = -1
    for r, (x0, n, f, sh, p, re) in enumerate(zip(first.tolist(), count.tolist(), file.tolist(), shift.tolist(),
                                                  pred.tolist(), recend.tolist())):
        src.file, x1, bad = f, x0 + n - 1, x0
        try:
            xs = range(x0, x1 + 1) if whole else sorted({x0, x1})
            samples = []
            for x in xs:
                bad = x
                samples.append(sample_at(src, b[x] + sh, b[x + 1] + sh))
                if whole and len(samples) > 1:
                    _pair(samples[-2], samples[-1])
            bad = x0
            _left(src, p, b[x0] + sh, samples[0])
            bad = x1
            _right(src, b[x1 + 1] + sh, re, samples[-1])
        except Bad as e:
            return bad, REASONS[str(e)]
        except Unread as e:
            if not e.missing:
                return bad, REASONS["eof"]
            need[r] = (f, e.off, e.n)
    return None
