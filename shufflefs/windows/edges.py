"""Tar samples against their neighbours in their files, as windows are built (`view`).

A tar record is one sample of a scan of its file only if the sample before it in the file ends
with a keyed member of another key and what follows it is the end of the archive or a keyed member
of another key (`formats.framing`).  Inside a window's run of consecutive samples the gather
compares each with the one before it; a run's first and last sample need bytes outside the
window: the sample before the run and the headers after it, in the file (not in a pool's or a
mixture's offsets: a mixture's stretch of a file ends where the file goes on, a stage holds runs
of samples away from their neighbours).  So every run is cut where its member (a pool's file, a
mixture's stretch) ends, and named by its file, its shift into it, where the sample before it
starts there (`member_edges`) and where the file's samples end (`file_runs`):

- from local files the compiled gather reads them: from the file's mapping (record orders), or
  with a few preads of 4 KiB per run (`fd_edges` names every run's file descriptor; a stage's runs
  are read in its source's files);
- a window built from `Source.read_runs` (object storage, or no compiled module) fetches them in
  the same requests as its records (`load_checked`): each run is extended back over the sample
  before it, when that is at most `PRED_WHOLE` bytes, and on by `HEAD` bytes (the next header),
  ranges the store coalesces with the run's own.  What is still missing (a larger sample's
  headers, a pax header's data, the neighbours of a mixture's stretch or of a stage's run, outside
  the source's offsets) is fetched in rounds of small ranged reads, one per run still open.  A
  sample walked once is remembered with its index (`seen_of`): its neighbours' windows need not
  fetch it again, so after a first epoch nothing more is fetched.

Measured (`tools/tar_edges_cost.py`, retired, in git at 9526d83: a shard of samples of three members, ~100 KB of ``.jpg`` +-20%,
a ``.cls`` and a ``.json``, in a local moto server; the whole view read every epoch; GETs and bytes
the mount fetched, against the code that did not fetch neighbours):

| mount options | epoch 0: GETs, bytes fetched / record bytes | epoch 1 on |
|---|---|---|
| defaults (``stratified``, 8 MiB blocks, 64 MiB buffer; 2,500 samples, 258 MB) | 52 (was 43), 1.006 | 44 GETs (was 44), 1.000 |
| ``--block-size 1MiB`` (1,000 samples, 103 MB) | 74 (was 74), 1.038 | 72 (was 72), 1.000 |
| ``--strategy full`` (1,000 samples) | 301 (was 451: the samples before bridge gaps), 1.227 | 463 (was 463), 1.000 |

With the default blocks a run of 8 MiB of samples already fills the store's largest GET (8 MiB):
the sample before it adds a short second part to about half of the runs of the first epoch.
"""

from __future__ import annotations

import threading
import weakref
from typing import NamedTuple

import numpy as np

from ..formats.base import FramingError
from ..formats.framing import TAR, check_pieces, framing_failure, unterminated
from ..index.table import RecordIndex
from ..index.joined_index import split_runs
from ..sources.base import Runs, Source, finish_all, gather
from .layout import id_runs

I64 = np.int64
PRED_WHOLE = 256 << 10
"""A run is fetched with the whole sample before it up to this size (one range with the run);
the headers of a larger one are fetched one by one (a round trip each)."""
HEAD = 2048
"""Bytes fetched after a run: the next sample's first header, with room for a long name's header
and data before it (GNU or pax), or a directory's header."""
NEED_MIN = 4 << 10
"""Bytes fetched at least per missing range (a header, and often the next small member's)."""
ROUNDS = 4096
"""More rounds than this means the check makes no progress: an internal error."""


def member_edges(index: RecordIndex) -> tuple[np.ndarray, np.ndarray]:
    """Per member of ``index`` (a single file: one), where the sample before its first starts in
    its file (-1: none) and where its file's samples end, in file offsets."""
    edges = getattr(index, "member_edges", None)
    if edges is not None:
        return edges()
    return np.full(1, -1, I64), np.full(1, index.trailer_start, I64)


def runs_args(index: RecordIndex, framing: int, edges: tuple | None, report: np.ndarray | None) -> tuple:
    """What `_gather.build_window` takes after ``newline_ids`` for a framing check (``edges``:
    `fd_edges`' for tar, which also remembers the samples walked)."""
    return (framing, member_firsts(index), edges, report, unterminated(index),
            *(seen_of(index) if edges is not None else ()))


def mapped_args(index: RecordIndex, framing: int) -> tuple:
    """What `_gather.gather_mapped` takes after ``unterminated`` for the tar check (`TAR`): the
    members' neighbours in their files and the samples walked before."""
    return (*member_edges(index), *seen_of(index)) if framing == TAR else ()


def member_firsts(index: RecordIndex) -> np.ndarray:
    """Where the members (files, or a mixture's segments) of an index begin: records of two
    members are not neighbours in a file."""
    firsts = getattr(index, "member_firsts", None)
    return np.zeros(1, I64) if firsts is None else np.ascontiguousarray(firsts, I64)


class FileRuns(NamedTuple):
    """Ascending runs of consecutive records, each in one member: records ``[first, first+count)``
    at file offsets ``bounds + shift`` of file ``file``; ``pred``: where the sample before the run
    starts in that file (-1: none); ``recend``: where the file's samples end; ``pred_id``,
    ``next_id``: the records before and after the run in its member (-1: none)."""

    first: np.ndarray
    count: np.ndarray
    member: np.ndarray
    file: np.ndarray
    shift: np.ndarray
    pred: np.ndarray
    recend: np.ndarray
    pred_id: np.ndarray
    next_id: np.ndarray

    def take(self, which: np.ndarray) -> "FileRuns":
        return FileRuns(*(a[which] for a in self))

    @property
    def checked(self) -> tuple[np.ndarray, ...]:
        """The runs as ``check_pieces`` takes them."""
        return self.first, self.count, self.file, self.shift, self.pred, self.recend


def file_runs(index: RecordIndex, first: np.ndarray, count: np.ndarray) -> FileRuns:
    """Runs ``[first, first+count)`` (ascending) cut where members end, each placed in its file."""
    first, count = np.asarray(first, I64), np.asarray(count, I64)
    firsts = getattr(index, "member_firsts", None)
    if firsts is None:
        member = np.zeros(len(first), I64)
        file, shift, starts = member, member, np.array([0, index.n], I64)
    else:
        first, count, member = split_runs(firsts, first, count)
        file, shift, starts = index.member_file[member], index.shifts[member], firsts
    mpred, mrecend = member_edges(index)
    inside, end = first > starts[member], first + count
    pred = np.where(inside, index.bounds[np.maximum(first - 1, 0)] + shift, mpred[member])
    return FileRuns(first, count, member, file, shift, pred.astype(I64), mrecend[member],
                    np.where(inside, first - 1, -1), np.where(end < starts[member + 1], end, -1))


def fd_edges(index: RecordIndex, placed: Runs, source: Source) -> tuple[tuple[np.ndarray, ...], FileRuns]:
    """The ``edges`` of `_gather.build_window` for the runs ``placed``: each cut where its member
    ends, with the descriptor of its file (a stage's runs: of its source's file; -1 where that has
    none, object storage: `check_detached`), and the runs."""
    runs = file_runs(index, placed.first, placed.count)
    origin = getattr(source, "origin", source)
    if origin is source and len(runs.first) == len(placed.first):
        where = placed  # a source's own runs never cross its members: the same runs
    else:
        where = origin.place(index, runs.first, runs.count) if len(runs.first) else None
    fd = where.fd if where is not None else np.full(len(runs.first), -1, I64)
    return (runs.first, runs.count, np.asarray(fd, I64), runs.shift, runs.pred, runs.recend), runs


def file_sizes(index: RecordIndex) -> np.ndarray:
    frames = getattr(index, "member_frames", None)
    return np.array([f[0] for f in frames] if frames is not None else [index.size], I64)


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranges sorted by start, merged where they overlap or touch: ``(starts, ends, group of
    each given range)``."""
    reach = np.maximum.accumulate(ends)
    new = np.concatenate(([True], starts[1:] > reach[:-1]))
    group = np.cumsum(new) - 1
    return starts[new], np.maximum.reduceat(ends, np.flatnonzero(new)), group


def _read_files(origin: Source, file: np.ndarray, starts: np.ndarray, ends: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Ranges of files (grouped by file, ascending and disjoint in each) read from ``origin`` (a
    pool: its member files, all in flight together) into one buffer: ``(buffer, where each
    range is in it)``."""
    files = getattr(origin, "files", None)
    size = ends - starts
    buf = np.empty(int(size.sum()), np.uint8)
    pos = np.cumsum(size) - size
    waits = []
    for f in np.unique(file).tolist():
        rows = np.flatnonzero(file == f)
        src = files[f] if files is not None else origin
        part = buf[int(pos[rows[0]]): int(pos[rows[-1]] + size[rows[-1]])]
        begin = getattr(src, "begin_runs", None)
        if begin is not None:
            waits.append(begin(starts[rows], ends[rows], part))
        else:
            src.read_runs(starts[rows], ends[rows], part)
    finish_all(waits)  # every one waited for: none may still write into ``buf`` after a raise
    return buf, pos


_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SEEN_LOCK = threading.Lock()


def seen_of(index: RecordIndex) -> tuple[np.ndarray, np.ndarray]:
    """What the checks of an index's windows found of its samples (key hashes, and flags: bit 0
    walked, 1 and 2 whether its first and last member have a key; 9 bytes a record, for as long
    as the index is used), so that a neighbour walked for one window is not fetched again for
    another (after a first epoch, none is)."""
    with _SEEN_LOCK:
        got = _SEEN.get(index)
        if got is None:
            got = _SEEN[index] = (np.zeros(index.n, np.uint64), np.zeros(index.n, np.uint8))
        return got


def _walked(flags: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return (ids >= 0) & (flags[np.maximum(ids, 0)] & 1).astype(bool)


class Checker:
    """`check_pieces` over pieces that grow: what runs miss is fetched from ``origin``, round
    after round, until every run is checked or one fails."""

    def __init__(self, index: RecordIndex, origin: Source, path: str) -> None:
        self.index, self.origin, self.path = index, origin, path
        self.seen = seen_of(index)
        self.sizes = file_sizes(index)
        self.bufs: list[np.ndarray] = []
        self.pieces: list[tuple[np.ndarray, ...]] = []

    def add(self, buf: np.ndarray, file: np.ndarray, start: np.ndarray, end: np.ndarray, pos: np.ndarray) -> None:
        """Pieces of ``buf``: bytes ``[start, end)`` of files ``file`` at ``pos``."""
        self.pieces.append((np.full(len(file), len(self.bufs), I64), file, start, end, pos))
        self.bufs.append(buf)

    def fetch(self, file: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Ranges of files (clipped at their ends, merged per file) fetched as one more buffer."""
        file, starts = np.asarray(file, I64), np.asarray(starts, I64)
        ends = np.minimum(ends, self.sizes[file])
        keep = ends > starts
        merged = []
        for f in np.unique(file[keep]).tolist():
            rows = np.flatnonzero(keep & (file == f))
            rows = rows[np.argsort(starts[rows], kind="stable")]
            s, e, _ = _merge(starts[rows], ends[rows])
            merged.append((np.full(len(s), f, I64), s, e))
        if merged:
            f, s, e = (np.concatenate(c) for c in zip(*merged))
            buf, pos = _read_files(self.origin, f, s, e)
            self.add(buf, f, s, e, pos)

    def run(self, runs: FileRuns, whole: bool) -> None:
        """`FramingError` for the first wrong run, after fetching what the runs miss."""
        for _ in range(ROUNDS):
            if not len(runs.first):
                return
            cols = [np.concatenate(c) for c in zip(*self.pieces)] if self.pieces else [np.zeros(0, I64)] * 5
            order = np.lexsort((cols[2], cols[1]))
            need = np.empty((len(runs.first), 3), I64)
            failed = check_pieces(tuple(self.bufs), tuple(c[order] for c in cols), self.sizes, self.index.bounds,
                                  runs.checked, whole, need, (runs.pred_id, runs.next_id, *self.seen))
            if failed is not None:
                raise framing_failure(self.index, self.path, *failed)
            left = np.flatnonzero(need[:, 0] >= 0)
            runs = runs.take(left)
            need = need[left]
            self.fetch(need[:, 0], need[:, 1], need[:, 1] + np.maximum(need[:, 2], NEED_MIN))
        raise FramingError(self.path, None, "the check of the samples' neighbours made no progress")


def load_checked(index: RecordIndex, ids: np.ndarray, source: Source, out: np.ndarray | None, path: str
                 ) -> np.ndarray:
    """`layout.assemble` of a tar window from ``source.read_runs``, every sample checked whole and
    against its neighbours in its file (`FramingError`), the neighbours fetched with the records
    (see the module docstring)."""
    ids = np.asarray(ids, I64)
    lengths = index.record_lengths(ids)
    total = int(lengths.sum())
    out = out[:total] if out is not None and len(out) >= total else np.empty(total, np.uint8)
    if not len(ids):
        return out
    runs = file_runs(index, *id_runs(ids))
    b = index.bounds
    lo, hi = b[runs.first], b[runs.first + runs.count]
    check = Checker(index, source, path)
    _, flags = check.seen
    # the neighbours in the member (the source's offsets) not walked before: fetched with the run
    before = (runs.pred_id >= 0) & ~_walked(flags, runs.pred_id)
    prev = b[np.maximum(runs.pred_id, 0)]
    start = np.where(before & (lo - prev <= PRED_WHOLE), prev, lo)
    after = (runs.next_id >= 0) & ~_walked(flags, runs.next_id)
    end = np.where(after, np.minimum(hi + HEAD, b[np.maximum(runs.next_id, 0) + 1]), hi)
    starts, ends, group = _merge(start, end)
    buf = source.read_runs(starts, ends)
    at = np.cumsum(ends - starts) - (ends - starts)  # each merged range in ``buf``
    run_at = at[group] + lo - starts[group]
    r = np.searchsorted(runs.first, ids, side="right") - 1
    gather(buf, run_at[r] + b[ids] - lo[r], lengths, out, np.cumsum(lengths) - lengths)
    check.add(buf, *_pieces(index, starts, ends, at))
    check.run(runs, whole=True)
    return out


def _pieces(index: RecordIndex, starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, ...]:
    """Ranges of the index's offsets (at ``at`` of a buffer) as ranges of its files: ``(file,
    start, end, position)``."""
    firsts = getattr(index, "member_firsts", None)
    if firsts is None:
        return np.zeros(len(starts), I64), starts, ends, at
    a, n, m = split_runs(index.bounds[firsts], starts, ends - starts)
    g = np.searchsorted(starts, a, side="right") - 1
    file, fa = index.member_file[m], a + index.shifts[m]
    return file, fa, fa + n, at[g] + a - starts[g]


def check_detached(window: np.ndarray, ids: np.ndarray, index: RecordIndex,
                   edges: tuple[tuple[np.ndarray, ...], FileRuns], source: Source, path: str,
                   report: np.ndarray) -> None:
    """After `_gather.build_window` with `fd_edges`: a stage's source files it read neighbours
    from are verified (a file changed meanwhile is stale, not a wrong index), and unless the
    ``report`` has a failure, the runs whose files have no descriptor (a stage in front of object
    storage) are checked: their first and last samples walked in ``window`` (records ``ids`` in
    view order), the neighbours fetched from the stage's source."""
    origin = getattr(source, "origin", source)
    fds = np.unique(edges[0][2])
    if origin is not source:
        for fd in fds[fds >= 0].tolist():
            origin.file_of(fd).verify_read(None)
    apart = np.flatnonzero(edges[0][2] < 0)
    if report[1] or not len(apart):
        return
    runs, ids = edges[1].take(apart), np.asarray(ids, I64)
    out_len = index.out_lengths(ids)
    order = np.argsort(ids, kind="stable")
    pos = (np.cumsum(out_len) - out_len)[order]
    x = np.concatenate((runs.first, runs.first + runs.count - 1))
    sh = np.concatenate((runs.shift, runs.shift))
    file = np.concatenate((runs.file, runs.file))
    b = index.bounds
    check = Checker(index, origin, path)
    check.add(window, file, b[x] + sh, b[x + 1] + sh, pos[np.searchsorted(ids[order], x)])
    _, flags = check.seen
    first_at = b[runs.first] + runs.shift
    whole_prev = (runs.pred >= 0) & (first_at - runs.pred <= PRED_WHOLE) & ~_walked(flags, runs.pred_id)
    end_at = b[runs.first + runs.count] + runs.shift
    tail = (end_at != runs.recend) & ~_walked(flags, runs.next_id)
    check.fetch(np.concatenate((runs.file[whole_prev], runs.file[tail])),
                np.concatenate((runs.pred[whole_prev], end_at[tail])),
                np.concatenate((first_at[whole_prev], end_at[tail] + HEAD)))
    check.run(runs, whole=False)
