"""Numbered JSON lines whose every byte follows from the line's number, and a vectorised check
that bytes are exactly those lines in some order (a Counter of a million lines per whole read
took the CPU the daemon under test needs)."""

from __future__ import annotations

from typing import Callable

import numpy as np

HEAD, MID, TAIL = b'{"i": ', b', "p": "', b'"}\n'


def numbered_lines(n: int, digits: int, spread: int) -> bytes:
    """Line i: ``{"i": <i in digits>, "p": "<x * (i % spread)>"}``."""
    return b"".join(HEAD + b"%0*d" % (digits, i) + MID + b"x" * (i % spread) + TAIL for i in range(n))


def permutation_check(n: int, digits: int, spread: int) -> Callable[[bytes], bool]:
    """A test that bytes are the `numbered_lines` of ``n``, each exactly once, in any order."""
    base = len(HEAD) + digits + len(MID) + len(TAIL)
    at_id = np.arange(len(HEAD), len(HEAD) + digits)
    at_mid = np.arange(len(HEAD) + digits, len(HEAD) + digits + len(MID))
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    head, mid = np.frombuffer(HEAD, np.uint8), np.frombuffer(MID, np.uint8)

    def check(data: bytes) -> bool:
        b = np.frombuffer(data, np.uint8)
        if len(b) == 0 or b[-1] != 10:
            return False
        ends = np.flatnonzero(b == 10)
        if len(ends) != n:
            return False
        starts = np.concatenate(([0], ends[:-1] + 1))
        if np.any(ends - starts + 1 < base):
            return False
        ids = ((b[starts[:, None] + at_id].astype(np.int64) - 48) * powers).sum(axis=1)
        return bool(np.array_equal(np.sort(ids), np.arange(n))
                    and np.array_equal(ends - starts + 1, base + ids % spread)
                    and (b[starts[:, None] + np.arange(len(HEAD))] == head).all()
                    and (b[starts[:, None] + at_mid] == mid).all()
                    and (b[ends - 2] == ord('"')).all() and (b[ends - 1] == ord("}")).all()
                    # every payload byte is an x: the x count equals the payload bytes
                    and np.count_nonzero(b == ord("x")) == int((ids % spread).sum()))

    return check
