"""The files a mount read with stages, in the order it first opened them, kept for the next mount
of the same source root.

A job run again mounts, then spends seconds starting (imports, a model, worker processes) before
its first read; a stage written in that time is ready at the first open, where one written at
the open holds the reader back by its whole build.  So at unmount the order of the last epoch
is written beside the kept copies (``read-orders/<key of the root>.json``), and a later mount
of that root starts the stage of the first file at its own epoch at once, and builds ahead in
that order from the first open on (`EpochPrep.at_mount`).  A file that is damaged, of another
version or root, or names paths outside the root is ignored.  Blocking, no FUSE."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path, PurePosixPath

from ..index.table import write_atomically

log = logging.getLogger("shufflefs")

ORDERS_DIR = "read-orders"
MAX_FILES = 10_000
"""Files kept in an order: the next mount uses its first few."""
MAX_BYTES = 4 << 20
"""A larger order file is not read (not one this daemon wrote)."""
VERSION = 1

File = tuple[str, int, int]
"""(relpath, part, parts): a view's file and rank share, as `Passthrough` keys its opens."""


def order_file(directory: str, source: str) -> str:
    key = hashlib.blake2b(source.encode("utf-8", "surrogateescape"), digest_size=10).hexdigest()
    return os.path.join(directory, f"{key}.json")


def save_order(directory: str, source: str, files: list[File]) -> bool:
    """Write the order ``files`` of the root ``source`` (replacing the last one, atomically);
    False if it could not be written (logged)."""
    body = json.dumps({"v": VERSION, "source": source, "files": [list(f) for f in files[:MAX_FILES]]},
                      ensure_ascii=False).encode("utf-8", "surrogateescape")
    try:
        os.makedirs(directory, exist_ok=True)
        write_atomically(Path(order_file(directory, source)), lambda out: out.write(body), prefix=".new-",
                         sync=False)  # lost in a crash: the next mount then starts no stage, no harm
    except OSError as e:
        log.debug("the order of the files read is not kept for the next mount: %s", e)
        return False
    return True


def load_order(directory: str, source: str) -> list[File]:
    """The order the last mount of ``source`` kept, or [] (none, damaged, of another root)."""
    try:  # not blocking on a FIFO, nor following a link: only a plain file this daemon could write
        fd = os.open(order_file(directory, source), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            return []
        got = json.loads(raw.decode("utf-8", "surrogateescape"))
    except (OSError, ValueError):
        return []
    if not isinstance(got, dict) or got.get("v") != VERSION or got.get("source") != source:
        return []
    files = got.get("files")
    if not isinstance(files, list):
        return []
    out: list[File] = []
    for f in files[:MAX_FILES]:
        if not (isinstance(f, list) and len(f) == 3 and _relpath(f[0]) and type(f[1]) is int and type(f[2]) is int
                and 0 <= f[1] < f[2] <= 1 << 20):
            return []  # not what `save_order` writes: none of it is trusted
        out.append((f[0], f[1], f[2]))
    return out


def _relpath(p: object) -> bool:
    """A path inside the root, as views are named: relative, no ``..``, no empty part."""
    if not isinstance(p, str) or not p or "\0" in p or p.startswith("/"):
        return False
    parts = PurePosixPath(p).parts
    return all(part not in ("..", ".") for part in parts) and "//" not in p
