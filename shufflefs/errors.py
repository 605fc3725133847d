"""Errors that carry what a reader, a log line and `shufflefs stat` need: an errno, a file and an offset."""

from __future__ import annotations

import errno as _errno


class ShuffleError(Exception):
    """Base class: a problem with one source file that must never turn into wrong bytes."""

    errno: int = _errno.EIO

    def __init__(self, path: str, offset: int | None, message: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.message = message
        where = f" at source offset {offset}" if offset is not None else ""
        super().__init__(f"{self.path}{where}: {message}")

    def __reduce__(self) -> tuple:
        # Exception pickles ``args`` (the one formatted message); rebuild from the three fields
        # instead, so that errors raised in an indexing process arrive intact.
        return type(self), (self.path, self.offset, self.message), self.__dict__


class FormatError(ShuffleError):
    """The source is not a valid file of its format (truncated, corrupt, inconsistent header)."""

    errno = _errno.EIO


class StaleSourceError(ShuffleError):
    """The source file changed or disappeared since its index was built."""

    errno = _errno.ESTALE


class StageError(ShuffleError):
    """A node-local stage file (``--stage-dir``) is missing, short or could not be written."""

    errno = _errno.EIO


class ResumeMismatch(ShuffleError):
    """A resume state (``user.shufflefs.resume``) that does not fit a view: a count past the end
    of one of its streams (a state of another dataset, seed or strategy)."""

    errno = _errno.EINVAL


DESCRIPTOR_ERRNOS = (_errno.EMFILE, _errno.ENFILE)
"""Out of file descriptors: the process's limit (EMFILE) or the system's (ENFILE).  A reader gets
that errno, never EIO: the file is fine, and closing files (or a higher limit) cures it."""

UNDECIDED_ERRNOS = (*DESCRIPTOR_ERRNOS, _errno.ETIMEDOUT, _errno.ESHUTDOWN)
"""A check of whether a file is still the version a view shows that ended in one of these (out of
descriptors, no answer within the deadline, unmounting) learned nothing: the open gets that errno,
logged, never ESTALE, which tells the kernel the file changed."""


def descriptors_note(e: BaseException) -> str:
    """For a log line: why the daemon is out of descriptors and what to raise ("" for other errors)."""
    if not isinstance(e, OSError) or e.errno not in DESCRIPTOR_ERRNOS:
        return ""
    if e.errno == _errno.ENFILE:
        return " (the system is out of file descriptors: raise fs.file-max or close files)"
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = f"{soft} (hard limit {hard})"
    except (ImportError, OSError, ValueError):
        limit = "its limit"
    return (f" (the daemon is out of file descriptors: it may hold {limit}; raise 'ulimit -n' "
            "(LimitNOFILE= for a service) before mounting, or close files)")
