"""Level: mounted (real FUSE mounts, real readers).

``user.shufflefs.epoch`` takes an epoch exactly as it reads back (a decimal from 0 to 2**31-1, no
sign, space or leading zero), optionally followed by one newline; anything else is EINVAL, with a
log line, and leaves every epoch as it was."""

from __future__ import annotations

import errno
import os

import pytest

from shufflefs.config import EPOCH_XATTR, MAX_EPOCH

LINES = b"".join(b"%d\n" % i for i in range(300))
GOOD = [(b"0", 0), (b"7", 7), (b"12\n", 12), (str(MAX_EPOCH).encode(), MAX_EPOCH),
        (str(MAX_EPOCH).encode() + b"\n", MAX_EPOCH)]
BAD = [b" 1", b"1 ", b"\t1", b"1\n\n", b"\n1", b"1\r\n", b"+1", b"-1", b"01", b"007", b"00", b"",
       b"\n", b"1e3", b"0x10", b"1_000", b"\xd9\xa1", b"\xef\xbc\x91", b"1\x00", b"next",
       str(MAX_EPOCH + 1).encode(), b"9" * 11, b"1" * 100]


def test_epoch_values_are_exact_decimals_with_at_most_one_trailing_newline(mount):
    """Holds: SEMANTICS.md#epochs-values, SEMANTICS.md#errors-einval"""
    m = mount({"a.jsonl": LINES, "d/b.jsonl": LINES})
    for where in ("", "d", "a.jsonl"):
        for value, epoch in GOOD:
            os.setxattr(m.path(where), EPOCH_XATTR, value)
            assert m.xattr("epoch", where) == str(epoch)
    m.set_epoch(3)
    for where in ("", "d", "a.jsonl"):
        for value in BAD:
            with pytest.raises(OSError) as e:
                os.setxattr(m.path(where), EPOCH_XATTR, value)
            assert e.value.errno == errno.EINVAL, (where, value)
            assert m.xattr("epoch", where) == "3", (where, value)
    assert "epoch of /d not set: b' 1' is not an epoch" in m.stderr()
    assert sorted(open(m.path("a.jsonl"), "rb").read().split()) == sorted(LINES.split())
