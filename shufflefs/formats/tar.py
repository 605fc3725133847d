"""Tar archives as WebDataset shards: a record is one sample, the consecutive members whose names
share a key (the path up to the first dot of the basename, as ``webdataset`` groups them).

A sample moves byte for byte: every member's 512-byte header, the GNU long-name (``././@LongLink``)
and pax headers in front of it, its data and the padding to 512 bytes.  Members without a key
(directories, links, names without a dot, global pax headers) travel with the sample that follows
them; those before the first keyed member stay first, with anything else before it (the header of
the view), and the end-of-archive blocks and the padding after them stay last.  So every view is
a valid tar of the same members.

The scan is vectorised over 512-byte blocks: every block whose magic reads ``ustar`` and whose
checksum holds is a candidate header, each candidate's successor (the block after its data) is
computed at once, and the chain of real headers from block 0 is found by pointer doubling (about
20 numpy passes, whatever the member count), so blocks of member data that happen to look like
headers (a tar inside a tar) are never taken for members.  Names are read as fixed-width rows
(``prefix/name`` of ustar headers, GNU long names); only pax headers, which writers emit for
names over 100 bytes or not in ASCII, are parsed one at a time.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..index.table import RecordIndex
from .base import Format, Progress, Read, WindowCheck, as_bytes, bad_index, framing_error, window_ends

BLOCK = 512
REGULAR = frozenset(b"07\0")
"""Type flags of members whose data follows the header (regular and contiguous files)."""
META = frozenset(b"LKx")
"""GNU long name, GNU long link target, pax extended header: they describe the next member."""
EXTENDED = frozenset(b"g")
"""A global pax header: applies to the members after it (travels with the next sample)."""
NO_DATA = frozenset(b"123456")
"""Links, devices, directories and FIFOs: no data blocks, whatever their size field says (as
``tarfile`` reads them)."""
NAME_ROWS = 1 << 16
"""Members whose names are assembled at once (bounds the temporary matrices)."""


def _first(mask: np.ndarray, default: int) -> np.ndarray:
    """Column of the first True in each row, or ``default``."""
    return np.where(mask.any(axis=1), mask.argmax(axis=1), default)


def _octal(fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Octal numbers of fixed-width header fields (leading spaces allowed, the digits ended by
    NUL, space or the field's end): ``(values, ok)``, vectorised over the rows."""
    n, width = fields.shape
    col = np.arange(width)[None, :]
    digit = (fields >= 0x30) & (fields <= 0x37)
    start = _first(digit, width)
    end = _first(~(digit | (col < start[:, None])), width)  # the first non-digit after the digits
    at = np.minimum(end, width - 1)
    stop = fields[np.arange(n), at]
    ok = (start < width) & ((end == width) | (stop == 0) | (stop == 0x20))
    ok &= ((fields == 0x20) | (col >= start[:, None])).all(axis=1)  # only spaces before the digits
    power = end[:, None] - 1 - col
    take = digit & (col >= start[:, None]) & (power >= 0)
    weights = np.where(take, np.left_shift(1, 3 * np.maximum(power, 0)), 0)
    return ((fields.astype(np.int64) - 0x30) * weights).sum(axis=1), ok


def _sizes(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Size fields: octal, or big-endian base-256 (first byte 0x80) for sizes of 8 GiB and more."""
    value, ok = _octal(sizes)
    b256 = sizes[:, 0] == 0x80
    if b256.any():
        rows = sizes[b256]
        fits = (rows[:, 1:4] == 0).all(axis=1) & (rows[:, 4] < 0x80)
        big = rows[:, 4:12].copy().view(">u8").ravel().astype(np.int64)
        value[b256] = np.where(fits, big, -1)
        ok[b256] = fits
    return value, ok


def _candidates(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block numbers that hold a ustar header with a valid checksum, and those that fail only
    the checksum (for a precise error); `NAME_ROWS` headers at a time (bounded memory)."""
    magic = (blocks[:, 257] == 0x75) & (blocks[:, 258] == 0x73) & (blocks[:, 259] == 0x74) \
        & (blocks[:, 260] == 0x61) & (blocks[:, 261] == 0x72)
    at = np.flatnonzero(magic)
    good = np.zeros(len(at), bool)
    for lo in range(0, len(at), NAME_ROWS):
        rows = blocks[at[lo: lo + NAME_ROWS]]
        field = rows[:, 148:156]
        stored, ok = _octal(field)
        fine = ok & (rows.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 0x20 == stored)
        retry = np.flatnonzero(ok & ~fine)  # some old writers summed signed bytes
        if len(retry):
            signed = rows[retry].view(np.int8)
            fine[retry] = signed.sum(axis=1, dtype=np.int64) - signed[:, 148:156].sum(axis=1, dtype=np.int64) \
                + 8 * 0x20 == stored[retry]
        good[lo: lo + NAME_ROWS] = fine
    return at[good], at[~good]


def _chain(succ: np.ndarray) -> np.ndarray:
    """Indices reachable from 0 along ``succ`` (-1: none), ascending, by pointer doubling: with
    ``jump`` = succ applied 2**k times, the nodes reached so far are those at distances below 2**k,
    and ``jump`` of them adds the next 2**k; done once no node has a successor 2**k steps on."""
    on = np.zeros(len(succ), bool)
    on[0] = True
    jump = succ.astype(np.int64)
    while True:
        reach = jump[on]
        on[reach[reach >= 0]] = True
        live = jump >= 0
        nxt = np.full(len(succ), -1, np.int64)
        nxt[live] = jump[jump[live]]
        if not (nxt >= 0).any():
            return np.flatnonzero(on)
        jump = nxt


def _pax_path(data: bytes) -> bytes | None:
    """The ``path`` record of a pax extended header ("<length> <key>=<value>\\n" records)."""
    pos, path = 0, None
    while pos < len(data):
        sp = data.find(b" ", pos)
        if sp < 0:
            break
        try:
            length = int(data[pos:sp])
        except ValueError:
            break
        if length <= 0:
            break
        rec = data[sp + 1: pos + length - 1]
        key, _, value = rec.partition(b"=")
        if key == b"path":
            path = value
        pos += length
    return path


def _names(blocks: np.ndarray, heads: np.ndarray, override: dict[int, bytes], width: int) -> np.ndarray:
    """Full names of the members at header blocks ``heads`` as rows of ``width`` bytes (NUL
    padded): the name field, ``prefix/name`` where a POSIX header has a prefix (rare: names over
    100 bytes that split at a slash), or a long name from the member's meta headers."""
    out = np.zeros((len(heads), width), np.uint8)
    out[:, :100] = blocks[heads, :100]
    out[:, :100][_first(out[:, :100] == 0, 100)[:, None] <= np.arange(100)] = 0  # bytes after the NUL
    has_prefix = np.flatnonzero((blocks[heads, 262] == 0) & (blocks[heads, 345] != 0))
    if len(has_prefix):  # "ustar\0" headers (POSIX) with a prefix field in use
        rows = blocks[heads[has_prefix]]
        name, prefix = rows[:, :100], rows[:, 345:500]
        nlen, plen = _first(name == 0, 100), _first(prefix == 0, 155)
        j = np.arange(width)[None, :]
        k = j - (plen + 1)[:, None]  # where the name starts after "prefix/"
        full = np.where(j < plen[:, None], np.take_along_axis(prefix, np.minimum(j, 154), axis=1), 0)
        full[j == plen[:, None]] = 0x2F
        take = (k >= 0) & (k < nlen[:, None])
        full[take] = np.take_along_axis(name, np.clip(k, 0, 99), axis=1)[take]
        out[has_prefix] = full
    for i, long in override.items():
        out[i] = 0
        out[i, :len(long)] = np.frombuffer(long[:width], np.uint8)
    return out


def _keys(names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each name's key (the name up to the first dot of its basename, NUL padded) and whether it
    has one (as ``webdataset``'s ``base_plus_ext``: a dot with something before it in the
    basename; none for a name that ends in a slash)."""
    n, width = names.shape
    col = np.arange(width)[None, :]
    length = _first(names == 0, width)
    slash = names == 0x2F
    base = np.where(slash.any(axis=1), width - slash[:, ::-1].argmax(axis=1), 0)  # after the last slash
    dots = (names == 0x2E) & (col > base[:, None])
    dot = _first(dots, width)
    first = names[np.arange(n), np.minimum(base, width - 1)]
    keyed = (dot < length) & (base < length) & (first != 0x2E)
    return np.where(col < dot[:, None], names, 0).astype(np.uint8), keyed


class TarFormat(Format):
    """WebDataset shards (``.tar``): a record is one sample, moved with all its tar headers."""

    name = "tar"
    framing = "tar"
    extensions = {".tar": {}}

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        data = as_bytes(data)
        size = len(data)
        if size == 0:
            return RecordIndex(0, np.zeros(1, np.int64))
        nb = size // BLOCK
        if size % BLOCK:
            raise FormatError(path, nb * BLOCK, f"{size % BLOCK} bytes after the last whole 512-byte block: "
                              "not a tar archive, or a truncated one")
        blocks = data.reshape(nb, BLOCK)
        cand, bad_sum = _candidates(blocks)
        if progress is not None:
            progress(size)
        if not len(cand) or cand[0] != 0:
            if not blocks[0].any():  # an empty archive: end-of-archive blocks only
                return RecordIndex(size, np.zeros(1, np.int64))
            self._no_header(path, 0, bad_sum)
        typeflag = blocks[cand, 156]
        sizes, ok = _sizes(blocks[cand, 124:136])
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise FormatError(path, int(cand[i]) * BLOCK, "member size field is not a number")
        has_data = ~np.isin(typeflag, np.frombuffer(bytes(NO_DATA), np.uint8))
        sparse = typeflag == ord("S")
        nxt = cand + 1 + np.where(has_data, -(-sizes // BLOCK), 0)
        where = np.searchsorted(cand, nxt)
        hit = (where < len(cand)) & (cand[np.minimum(where, len(cand) - 1)] == nxt)
        chain = _chain(np.where(hit, where, -1))
        heads = cand[chain]
        last = int(chain[-1])
        end = int(nxt[last])
        if end > nb:
            raise FormatError(path, int(cand[last]) * BLOCK, f"member data runs {(end - nb) * BLOCK} bytes past "
                              "the end of the file (truncated archive)")
        if end < nb and blocks[end].any():
            self._no_header(path, end, bad_sum)
        if sparse[chain].any():
            i = int(heads[np.flatnonzero(sparse[chain])[0]])
            raise FormatError(path, i * BLOCK, "GNU sparse members are not supported")
        return self._samples(path, size, data, blocks, heads, typeflag[chain], sizes[chain], end)

    def frame_check(self) -> WindowCheck | None:
        return check_samples

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """Samples, the header and the trailer are whole 512-byte blocks; the header is whole
        members of no sample (what a scan keeps first) and the trailer starts with the end of
        the archive, so that no sample hides in either (the samples are checked as they are
        gathered, `formats.framing`)."""
        off = np.flatnonzero(index.bounds % BLOCK)
        if len(off) or index.size % BLOCK:
            raise bad_index(path, int(index.bounds[off[0]]) if len(off) else index.size,
                            "a sample that does not start on a 512-byte block")
        head, tail = index.header_end, index.trailer_start
        if head:
            try:
                kept = self.scan(np.frombuffer(read(0, head) + bytes(2 * BLOCK), np.uint8), path)
            except FormatError:
                raise bad_index(path, 0, "the header is not whole tar members") from None
            if kept.n or kept.trailer_start != head:
                raise bad_index(path, head, "a sample in the header")
        if tail < index.size and any(read(tail, tail + BLOCK)):
            raise bad_index(path, tail, "a member after the last sample")

    @staticmethod
    def _no_header(path: str, block: int, bad_sum: np.ndarray) -> None:
        why = "bad header checksum" if np.isin(block, bad_sum) else "no tar header where one must start"
        raise FormatError(path, block * BLOCK, why)

    def _samples(self, path: str, size: int, data: np.ndarray, blocks: np.ndarray, heads: np.ndarray,
                 typeflag: np.ndarray, sizes: np.ndarray, end: int) -> RecordIndex:
        meta = np.isin(typeflag, np.frombuffer(bytes(META), np.uint8))
        if meta[-1]:
            raise FormatError(path, int(heads[-1]) * BLOCK, "an extended header with no member after it")
        members = np.flatnonzero(~meta)
        # each member's first header: its meta headers run back to the previous member
        first = np.concatenate(([0], members[:-1] + 1))
        override: dict[int, bytes] = {}
        for i in np.flatnonzero(meta).tolist():  # long names: only members that have them
            owner = int(np.searchsorted(members, i))
            start = (int(heads[i]) + 1) * BLOCK
            body = data[start: start + int(sizes[i])].tobytes()
            flag = int(typeflag[i])
            if flag == ord("L"):
                override[owner] = body.split(b"\0", 1)[0]
            elif flag == ord("x"):
                long = _pax_path(body)
                if long is not None:
                    override[owner] = long
        prefixed = ((blocks[heads[members], 262] == 0) & (blocks[heads[members], 345] != 0)).any()
        width = max([256 if prefixed else 100] + [len(v) for v in override.values()])
        head_rows = heads[members]
        keys = np.zeros((len(members), width), np.uint8)
        keyed = np.zeros(len(members), bool)
        for lo in range(0, len(members), NAME_ROWS):
            part = {i - lo: v for i, v in override.items() if lo <= i < lo + NAME_ROWS}
            names = _names(blocks, head_rows[lo: lo + NAME_ROWS], part, width)
            keys[lo: lo + NAME_ROWS], keyed[lo: lo + NAME_ROWS] = _keys(names)
        keyed &= np.isin(typeflag[members], np.frombuffer(bytes(REGULAR), np.uint8))
        starts = heads[first] * BLOCK  # byte offset where each member's headers begin
        if not keyed.any():
            return RecordIndex(size, np.array([end * BLOCK], np.int64))
        kidx = np.flatnonzero(keyed)
        kk = keys[kidx]
        new = np.concatenate(([True], (kk[1:] != kk[:-1]).any(axis=1)))
        run_first = kidx[new]  # member index of each sample's first keyed member
        # a sample starts at its first keyed member, or at the keyless members just before it
        # (those after the previous sample's last keyed member); leading keyless ones are header
        prev_keyed_end = np.concatenate(([run_first[0]], kidx[np.flatnonzero(new)[1:] - 1] + 1))
        sample_first = prev_keyed_end
        bounds = np.concatenate((starts[sample_first], [end * BLOCK])).astype(np.int64)
        self._check_adjacent(path, kk[new], bounds)
        return RecordIndex(size, bounds)

    @staticmethod
    def _check_adjacent(path: str, run_keys: np.ndarray, bounds: np.ndarray) -> None:
        """Every key names one run of members: a key seen again later is a split sample."""
        if len(run_keys) < 2:
            return
        rows = np.ascontiguousarray(run_keys).view(np.dtype((np.void, run_keys.shape[1]))).ravel()
        order = np.argsort(rows, kind="stable")
        dup = np.flatnonzero(rows[order][1:] == rows[order][:-1])
        if len(dup):
            a, b = sorted((int(order[dup[0]]), int(order[dup[0] + 1])))
            key = run_keys[b].tobytes().rstrip(b"\0").decode("utf-8", "replace")
            raise FormatError(path, int(bounds[b]), f"sample {key!r} is split: its members are not adjacent "
                              f"(also at offset {int(bounds[a])}); webdataset would read it as two samples")


CHECK_ROWS = 8192
"""Sample headers checked at once (4 MiB of copied blocks)."""


_LANES = np.uint64(0x00FF00FF00FF00FF)


def _valid_headers(rows: np.ndarray) -> np.ndarray:
    """Which 512-byte ``rows`` (contiguous) are ustar headers whose checksum holds, like
    `_candidates` but summing each row as 64 words, two bytes per 16-bit lane (about 3x faster;
    rows that fail go through `_candidates`, which also accepts old signed-byte sums)."""
    words = rows.view(np.uint64)
    lanes = ((words & _LANES) + ((words >> np.uint64(8)) & _LANES)).sum(axis=1, dtype=np.uint64)
    mask = np.uint64(0xFFFF)
    total = sum(((lanes >> np.uint64(k)) & mask).astype(np.int64) for k in (0, 16, 32, 48))
    field = rows[:, 148:156]
    stored, ok = _octal(field)
    ok &= total - field.sum(axis=1, dtype=np.int64) + 8 * 0x20 == stored
    ok &= (rows[:, 257:262] == np.frombuffer(b"ustar", np.uint8)).all(axis=1)
    retry = np.flatnonzero(~ok)
    if len(retry):
        good, _ = _candidates(rows[retry])
        ok[retry[good]] = True
    return ok


def check_samples(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str) -> None:
    """Every sample of a gathered window starts with a ustar header whose checksum holds: its
    first block read (a sample is at least two blocks, so at most half the window's bytes)."""
    ids = np.asarray(ids, np.int64)
    if not len(ids):
        return
    lengths = index.record_lengths(ids)
    ends = window_ends(window, ids, index, path)
    bad = (lengths < BLOCK) | (lengths % BLOCK != 0)
    if bad.any():
        raise framing_error(path, index, ids, bad, "a sample of part of a block")
    blocks = window[: int(ends[-1])].reshape(-1, BLOCK)  # records of whole blocks: starts on the grid
    first = (ends - lengths) // BLOCK
    for lo in range(0, len(ids), CHECK_ROWS):
        bad[lo: lo + CHECK_ROWS] = ~_valid_headers(blocks[first[lo: lo + CHECK_ROWS]])
    if bad.any():
        raise framing_error(path, index, ids, bad, "no tar header where the sample starts")


FORMATS = (TarFormat,)
"""The formats this module adds to the registry (`shufflefs.formats.MODULES`)."""
