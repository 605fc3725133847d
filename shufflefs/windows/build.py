"""Windows of runs built by the compiled gather (`_gather.build_window`), and the bytes a window
gains over its source (added newlines); see `windows.view` for how a load chooses its build."""

from __future__ import annotations

import errno
from typing import Callable

import numpy as np

from ..formats.framing import unterminated
from ..index.table import RecordIndex
from ..sources.base import Members, Reader, Runs, Source
from ..sources.direct import DirectReader
from .edges import mapped_args, runs_args

try:
    from .._gather import build_window as _build_window  # compiled at install time; optional
except ImportError:  # pragma: no cover - depends on the build
    _build_window = None

RECORD_CHUNK = 1 << 17
"""Ids counted per slice by `added_newlines` (`view.RECORD_CHUNK` sizes a sparse build's passes)."""


def build_runs(out: np.ndarray, scratch: np.ndarray, index: RecordIndex, ids: np.ndarray, runs: Runs,
               newline_ids: np.ndarray, file_of: Callable[[int], Reader], framing: int = 0,
               report: np.ndarray | None = None, edges: tuple | None = None) -> np.ndarray:
    """Records ``ids`` (view order; the same records as ``runs``) read into ``out`` in one pass
    (see the module docstring); ``file_of(fd)`` names the file behind a descriptor.  Every file
    read is verified afterwards, so bytes of a file that changed meanwhile are never returned.
    ``framing``: the compiled check of every record (`FramingCheck.code`), its first failure in
    ``report`` (the caller raises it); ``edges``: the runs' files, for the check of tar samples
    against their neighbours there (`edges.fd_edges`)."""
    c = np.ascontiguousarray
    fds = c(runs.fd, np.int64)
    extra = runs_args(index, framing, edges, report) if framing else ()
    got = _build_window(out, scratch, index.bounds, c(ids, np.int64), c(runs.first, np.int64),
                        c(runs.count, np.int64), fds, c(runs.shift, np.int64), newline_ids, *extra)
    if isinstance(got, tuple):  # (run, file offset): that file ended early
        file_of(int(fds[got[0]])).ended(got[1])
        raise OSError(errno.EIO, "a file ended early")  # ended() raises; never serve a short window
    if len(fds):
        used, at = np.unique(fds, return_index=True)
        offsets = index.bounds[runs.first[at]] + runs.shift[at]
        for fd, off in zip(used.tolist(), offsets.tolist()):
            file_of(fd).verify_read(off)
    return out[:got]


def added_newlines(newline_ids: np.ndarray, ids: np.ndarray) -> int:
    """How many of ``ids`` gain a newline in the view (``newline_ids`` sorted; a repeated id
    counts each time): the window bytes that did not come from the source.  Works in slices of
    `RECORD_CHUNK` ids, so that a window of tiny records needs no array as long as its ids."""
    if not len(newline_ids) or not len(ids):
        return 0
    added = 0
    for lo in range(0, len(ids), RECORD_CHUNK):
        part = ids[lo: lo + RECORD_CHUNK]
        at = np.minimum(np.searchsorted(newline_ids, part), len(newline_ids) - 1)
        added += int(np.count_nonzero(newline_ids[at] == part))
    return added


def gather_members(out: np.ndarray, index: RecordIndex, ids: np.ndarray, members: Members,
                   source: Source, framing: int = 0, report: np.ndarray | None = None,
                   gather: Callable | None = None) -> np.ndarray:
    """Records ``ids`` copied in view order from the mappings of their files into ``out`` by
    ``gather`` (`_gather.gather_mapped`); a file that shrank under its mapping is reported by the
    source (`Reader.ended`), and every file is verified afterwards, as after preads.  ``framing``
    and ``report`` as for `build_runs`."""
    extra = (framing, report, unterminated(index), *mapped_args(index, framing)) if framing else ()
    got = gather(out, members.maps, index.bounds, np.ascontiguousarray(ids, np.int64), members.first,
                 members.slot, members.shift, index.newline_ids, *extra)
    if isinstance(got, tuple):  # (position in ids, file offset): that file ended early
        m = int(np.searchsorted(members.first, ids[got[0]], "right")) - 1
        source.file_of(int(members.fd[m])).ended(got[1])
        raise OSError(errno.EIO, "a file ended early")  # ended() raises; never serve a short window
    source.verify_open()
    return out[:got]


def direct_window(reader: DirectReader, index: RecordIndex, ids: np.ndarray, runs: tuple[np.ndarray, np.ndarray],
                  out: np.ndarray, source: Source, framing: int, report: np.ndarray, gather: Callable) -> np.ndarray:
    """Window ``ids`` (``runs``: the same as ascending runs) read past the page cache: the runs by
    O_DIRECT reads into an aligned buffer (`sources.direct`), then copied from it in view order
    with the framing check (first failure in ``report``), the source verified afterwards."""
    members, buf = reader.read(index.bounds, runs[0], runs[1])
    try:
        return gather_members(out, index, ids, members, source, framing, report, gather)
    finally:
        reader.release(buf)
