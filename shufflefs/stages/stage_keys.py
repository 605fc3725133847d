"""What a Parquet view's stage holds, as a key: a stage left by one mount is taken whole by a
later one that wants the same bytes, instead of being written again.

A stage's bytes follow from the source's version, the order of its rows, and the view's header
and footer: the encoding is deterministic (same code, same bytes).  A job that stops and is run
again reads the epoch it stopped in from its start, or the next one, whose stage the mount
before built ahead;
written again, that first epoch read its copy whole from disk before its first row (the default
order's first row group holds rows of every part of the file), where a kept stage is read like
any local file (docs/benchmark.md, Parquet views).  The key also holds the machine's boot: a
stage's pages may not have reached the disk before a crash, and after a reboot its bytes are
not trusted (a new boot's key never matches).  Pure logic, no FUSE.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from .. import __version__
from .kept_copies import keys_of

__all__ = ["STAGE_FORMAT", "boot_id", "stage_key"]

STAGE_FORMAT = 1
"""Raised whenever a change of the encoder changes the bytes of a stage of the same rows."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot's id (None where the kernel does not say: then no stage is kept)."""
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def stage_key(view: Any) -> str | None:
    """The key of ``view``'s stage (a `parquet_view.ParquetView`), or None when the view has no
    stamped source or the boot is unknown.  Costs a hash of 8 bytes per row (16 MB for 2 M rows:
    about 20 ms)."""
    boot, stamp = boot_id(), getattr(view.index, "stamp", None)
    if boot is None or stamp is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{STAGE_FORMAT}\0{__version__}\0{boot}\0{keys_of(view.path, stamp)[1]}\0".encode())
    h.update(len(view.header).to_bytes(8, "little") + bytes(view.header))
    h.update(len(view.trailer).to_bytes(8, "little") + bytes(view.trailer))
    for ids in view.ids_in_order():
        h.update(memoryview(np.ascontiguousarray(ids, np.int64)).cast("B"))
    return "k" + h.hexdigest()
