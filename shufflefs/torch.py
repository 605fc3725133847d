"""PyTorch helpers for training from shufflefs mounts (optional: needs ``torch``).

The mount does what a ``DistributedSampler`` does elsewhere: ``shufflefs mount SRC MNT --rank R
--world-size W`` shows rank R's share of every epoch in a fresh order, and ``MNT/.parts/K/i/``
splits that share among K DataLoader workers.  What is left for the training script is to set the
epoch and to let each worker read its own part, which is all this module does::

    from shufflefs.torch import LineDataset, set_epoch

    loader = DataLoader(LineDataset(mnt, ["train.jsonl"]), batch_size=64, num_workers=4)
    for epoch in range(epochs):
        set_epoch(mnt, epoch)          # before iter(loader): workers open the files afterwards
        for batch in loader:
            ...

No sampler and no per-record random access: every worker reads one part front to back, so
each rank sees each record of its share exactly once per epoch.  Nothing else in shufflefs
imports this module.
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path, PurePath
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .config import EPOCH_XATTR, MAX_EPOCH, PARTS_DIR

__all__ = ["rank_and_world", "set_epoch", "part_path", "LineDataset"]



class WorkerInfo(Protocol):
    """What `part_path` needs of ``torch.utils.data.get_worker_info()``."""

    id: int
    num_workers: int


def rank_and_world() -> tuple[int, int]:
    """This process's (rank, world size): from RANK and WORLD_SIZE (torchrun sets both), else from
    an initialised ``torch.distributed``, else (0, 1).  Pass the same values to ``shufflefs mount
    --rank R --world-size W`` (its defaults read the same variables)."""
    env = [os.environ.get(name) for name in ("RANK", "WORLD_SIZE")]
    if any(v is not None for v in env):
        if None in env:
            raise ValueError("RANK and WORLD_SIZE must be set together (only one of them is set)")
        try:
            rank, world = (int(v) for v in env)  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(f"RANK={env[0]!r} and WORLD_SIZE={env[1]!r} must be integers") from None
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        return 0, 1
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, world size {world})")
    return rank, world


def set_epoch(mount: str | os.PathLike, epoch: int) -> None:
    """Show ``epoch``'s order in every file of ``mount`` opened from now on (the analogue of
    ``DistributedSampler.set_epoch``).  Call it before creating the epoch's DataLoader iterator:
    files already open keep the epoch they were opened with.  ``mount`` is the mount root (a
    directory inside the mount sets only the files below it).  Raises OSError (ENOTSUP) if
    ``mount`` is not in a shufflefs mount."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch must be an integer in [0, {MAX_EPOCH}]: {epoch!r}")
    path = os.fspath(mount)
    try:  # a plain directory may accept a user.* attribute: only a mount has one to read
        os.getxattr(path, EPOCH_XATTR)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(errno.ENOTSUP, f"not a shufflefs mount (no {EPOCH_XATTR} attribute)", path) from None
        if e.errno == errno.ENOTCONN:
            raise OSError(e.errno, "the shufflefs daemon of this mount is gone", path) from None
        raise
    os.setxattr(path, EPOCH_XATTR, str(epoch).encode())


def part_path(mount: str | os.PathLike, relpath: str | os.PathLike,
              worker_info: WorkerInfo | None = None) -> Path:
    """The file a DataLoader worker reads of the view ``MNT/relpath``: inside worker i of K (from
    ``worker_info``, else ``get_worker_info()``), ``MNT/.parts/K/i/relpath``, so the K workers
    read disjoint parts that together are the view; in the main process (or with one worker, the
    same thing), ``MNT/relpath``."""
    rel = PurePath(relpath)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"relpath must be a path inside the mount: {str(relpath)!r}")
    if worker_info is None:
        worker_info = get_worker_info()
    if worker_info is None or worker_info.num_workers == 1:
        return Path(mount) / rel
    k, i = int(worker_info.num_workers), int(worker_info.id)
    if not 0 <= i < k:
        raise ValueError(f"worker id {i} is not in [0, {k})")
    return Path(mount, PARTS_DIR, str(k), str(i)) / rel


class _Main:
    id, num_workers = 0, 1


_MAIN = _Main()
"""The main process, as a worker: `part_path` of it is the view itself."""


class LineDataset(IterableDataset):
    """The records of line files (``.jsonl``, ``.ndjson``, ``.txt``: every line a record) in a
    shufflefs mount, decoded one line at a time.

    Each DataLoader worker reads its `part_path` of every file in ``relpaths``, in that order, with
    reads of the view's ``st_blksize`` (1 MiB), so the rank sees each record of its share exactly
    once per epoch.  ``decode`` gets a line's bytes without the newline; None yields the bytes.
    """

    def __init__(self, mount: str | os.PathLike, relpaths: str | os.PathLike | Sequence[str | os.PathLike],
                 decode: Callable[[bytes], Any] | None = json.loads) -> None:
        super().__init__()
        self.mount = Path(mount)
        self.relpaths = [relpaths] if isinstance(relpaths, (str, os.PathLike)) else list(relpaths)
        self.decode = decode
        for rel in self.relpaths:
            part_path(self.mount, rel, _MAIN)  # check every relpath now, not in a worker

    def __iter__(self) -> Iterator[Any]:
        decode = self.decode
        for rel in self.relpaths:
            path = part_path(self.mount, rel)
            buffering = max(os.stat(path).st_blksize, io.DEFAULT_BUFFER_SIZE)
            with open(path, "rb", buffering=buffering) as f:
                for line in f:
                    if line.endswith(b"\n"):
                        line = line[:-1]
                    yield line if decode is None else decode(line)
