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
each rank sees each record of its share exactly once per epoch.

To resume an epoch after a stop, on the same or another number of ranks and workers, let
`Progress` count what the training loop consumed and keep its `state_dict` in the checkpoint::

    progress = Progress(mnt)
    data = LineDataset(mnt, ["train.jsonl"], track=True)      # records come with their position
    loader = DataLoader(data, batch_size=64, num_workers=4)
    if resuming:
        progress.load_state_dict(ckpt["data"])               # the mount resumes that epoch
    for epoch in range(progress.epoch if resuming else 0, epochs):
        progress.start(epoch)                                 # set_epoch, unless resuming it
        for batch in progress.consume(loader):                # the records, positions stripped
            ...
            ckpt = {"model": ..., "data": progress.state_dict()}   # every rank's counts

Nothing else in shufflefs imports this module.
"""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
from pathlib import Path, PurePath
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .config import EPOCH_XATTR, MAX_EPOCH, PARTS_DIR, RESUME_INLINE, RESUME_XATTR

__all__ = ["rank_and_world", "set_epoch", "part_path", "LineDataset", "Progress"]


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
                 decode: Callable[[bytes], Any] | None = json.loads, track: bool = False) -> None:
        super().__init__()
        self.mount = Path(mount)
        self.relpaths = [relpaths] if isinstance(relpaths, (str, os.PathLike)) else list(relpaths)
        self.decode = decode
        self.track = track
        for rel in self.relpaths:
            part_path(self.mount, rel, _MAIN)  # check every relpath now, not in a worker

    def __iter__(self) -> Iterator[Any]:
        """Records; with ``track``, ``(record, position)`` pairs for `Progress.consume`, the
        position being ``(file number in relpaths, part, parts, records read of that part)``."""
        decode, info = self.decode, get_worker_info() or _MAIN
        part, parts = (0, 1) if info.num_workers == 1 else (int(info.id), int(info.num_workers))
        for f_no, rel in enumerate(self.relpaths):
            path = part_path(self.mount, rel)
            buffering = max(os.stat(path).st_blksize, io.DEFAULT_BUFFER_SIZE)
            with open(path, "rb", buffering=buffering) as f:
                for n, line in enumerate(f, 1):
                    if line.endswith(b"\n"):
                        line = line[:-1]
                    record = line if decode is None else decode(line)
                    yield (record, (f_no, part, parts, n)) if self.track else record


class Progress:
    """What a training loop consumed of each view in the current epoch, as a resume state
    (`shufflefs.strategies.resume`): ``consumed[r][i]`` records of rank r's part i, gathered from
    every rank.  Batches count once the loop has them (`consume`), so records a worker had read
    ahead are served again after a resume, never lost.

    ``mount``: this rank's mount root; ``relpaths``: the files of the `LineDataset` (its default:
    taken from the first tracked batch's dataset).  A resumed epoch keeps the layouts it ran under
    before, so a second stop appends to them, as the mount expects."""

    def __init__(self, mount: str | os.PathLike, relpaths: Sequence[str | os.PathLike] | None = None) -> None:
        self.mount = Path(mount)
        self.relpaths = [str(PurePath(r)) for r in relpaths] if relpaths is not None else None
        self.epoch: int | None = None
        self._before: dict[str, list[dict]] = {}  # layouts the epoch ran under before this run
        self._pending: int | None = None  # an epoch loaded, to be resumed by `start`
        self._counts: dict[tuple[int, int], list[int]] = {}  # (file, parts) -> records per part

    def start(self, epoch: int) -> None:
        """Begin ``epoch``: `set_epoch`, unless it is the epoch `load_state_dict` resumed."""
        if self._pending != epoch:
            set_epoch(self.mount, epoch)
            self._before = {}
        self._pending = None
        self.epoch = epoch
        self._counts = {}

    def consume(self, loader: Any) -> Iterator[Any]:
        """The loader's batches of ``(record, position)`` pairs (`LineDataset` with ``track``) as
        batches of records, counting each as consumed when it is handed out."""
        if self.relpaths is None:
            dataset = getattr(loader, "dataset", None)
            if not isinstance(dataset, LineDataset):
                raise ValueError("give Progress the relpaths of the dataset it counts")
            self.relpaths = [str(PurePath(r)) for r in dataset.relpaths]
        for batch in loader:
            if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
                raise ValueError("Progress.consume needs batches of (record, position): LineDataset(..., track=True)")
            records, positions = batch
            self.update(positions)
            yield records

    def update(self, positions: Any) -> None:
        """Count a batch's positions (four sequences: file, part, parts, records read of it)."""
        f_no, part, parts, n = (torch.as_tensor(p).reshape(-1).tolist() for p in positions)
        for f, i, k, m in zip(f_no, part, parts, n):
            row = self._counts.setdefault((f, k), [0] * k)
            row[i] = max(row[i], m)

    def _local(self) -> dict[str, dict[int, list[int]]]:
        out: dict[str, dict[int, list[int]]] = {}
        for (f, k), row in self._counts.items():
            out.setdefault(self.relpaths[f], {})[k] = row
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "views"}`` as `shufflefs epoch MNT E --resume` takes it, with every rank's
        counts (all ranks must call it together when torch.distributed is initialised)."""
        if self.epoch is None:
            raise RuntimeError("Progress.start(epoch) was never called")
        rank, world = rank_and_world()
        local = self._local()
        if world > 1:
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                raise RuntimeError(f"{world} ranks: initialise torch.distributed so that every rank's counts are gathered")
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, local)
        else:
            gathered = [local]
        views: dict[str, list[dict]] = {}
        for rel in sorted({r for g in gathered for r in g} | set(self._before)):
            layouts = [dict(x) for x in self._before.get(rel, [])]
            ks = {k for g in gathered for k in g.get(rel, {})}
            if len(ks) > 1:
                raise RuntimeError(f"{rel}: read with different numbers of loader workers at once: {sorted(ks)}")
            if ks:
                k = ks.pop()
                layouts.append({"world_size": world, "parts": k,
                                "consumed": [list(g.get(rel, {}).get(k, [0] * k)) for g in gathered]})
            views[rel] = layouts
        return {"epoch": self.epoch, "views": views}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume ``state``'s epoch on the mount (``user.shufflefs.resume``); the next `start` of
        that epoch keeps it.  Every rank loads the same state into its own mount."""
        text = json.dumps(state)
        value = text.encode()
        if len(value) > RESUME_INLINE:  # beyond what an attribute holds: the mount reads a file
            fd, path = tempfile.mkstemp(prefix="shufflefs-resume-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            value = b"@" + os.fsencode(path)  # read once, when the attribute is set
        try:
            os.setxattr(self.mount, RESUME_XATTR, value)
        finally:
            if value.startswith(b"@"):
                os.unlink(path)
        self.epoch = self._pending = int(state["epoch"])
        self._before = {rel: [dict(x) for x in layouts] for rel, layouts in state.get("views", {}).items()}
        self._counts = {}
