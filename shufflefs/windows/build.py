"""Windows of runs built by the compiled gather (`_gather.build_window`), and the bytes a window
gains over its source (added newlines); see `windows.view` for how a load chooses its build."""

from __future__ import annotations

import errno
from typing import Callable

import numpy as np

from ..index.table import RecordIndex
from ..sources.base import Reader, Runs
from .edges import runs_args

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
