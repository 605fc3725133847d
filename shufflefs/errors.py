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
