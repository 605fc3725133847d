"""What a user would pick instead of a shuffled mount, run on the same files.

* ``pread_dataset``: a PyTorch map-style ``Dataset`` doing one ``os.pread`` per record through an
  offset table (shufflefs's own index), sampled by ``RandomSampler`` through a ``DataLoader``
  (batches of 64 records, ``collate_fn=list``).
* ``mds_convert`` / ``mds_epoch``: MosaicML Streaming, converting the file to MDS shards
  (``MDSWriter``, one ``bytes`` column, no compression, default shard size) and iterating a
  local ``StreamingDataset`` with its default ``py1e`` shuffle.
* ``shuffle_once_copy``: Shuffle Once, i.e. a shuffled copy written once (shufflefs's ``once``
  plan: the source read sequentially into memory, records gathered window by window, written
  and fsynced) and then read front to back.

Each reader stops after ``max_seconds`` like `reads.Reading`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
import time
import types
from pathlib import Path

import numpy as np

from shufflefs.index import RecordIndex
from shufflefs.layout import assemble, slice_fetch
from shufflefs.strategies import ShuffleSpec, make_plan

from .reads import Reading

BATCH = 64


# --------------------------------------------------------------------------- PyTorch


class PreadRecords:
    """Map-style dataset: record i is one ``pread`` of ``lengths[i]`` bytes at ``starts[i]``.

    The file is opened lazily, so each DataLoader worker opens its own descriptor.
    """

    def __init__(self, path: Path, index: RecordIndex) -> None:
        self.path = str(path)
        self.starts = index.bounds[:-1]
        self.lengths = index.lengths
        self.fd: int | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> bytes:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self.fd, int(self.lengths[i]), int(self.starts[i]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "fd": None}


def _collate(batch: list) -> list:
    return batch


def pread_dataset(path: Path, index: RecordIndex, workers: int, max_seconds: float, seed: int = 0) -> Reading:
    import torch
    from torch.utils.data import DataLoader, Dataset, RandomSampler

    class _Records(PreadRecords, Dataset):
        pass

    ds = _Records(path, index)
    gen = torch.Generator()
    gen.manual_seed(seed)
    t0 = time.perf_counter()
    loader = DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(ds, generator=gen), num_workers=workers,
                        collate_fn=_collate, multiprocessing_context="fork" if workers else None)
    it = iter(loader)
    n = nbytes = 0
    first = None
    complete = True
    deadline = t0 + max_seconds
    try:
        for batch in it:
            if first is None:
                first = time.perf_counter() - t0
            n += len(batch)
            nbytes += sum(map(len, batch))
            if time.perf_counter() > deadline and n < len(ds):
                complete = False
                break
    finally:
        del it  # shuts the workers down
        if ds.fd is not None:
            os.close(ds.fd)
    return Reading(nbytes, n, time.perf_counter() - t0, first or 0.0, complete)


# --------------------------------------------------------------------------- MosaicML Streaming


def import_streaming() -> types.ModuleType | None:
    """``streaming``, or None if not installed or not importable (a dependency missing: its rows
    are then skipped rather than the run failing).

    The package imports its torchvision datasets at import time; CPU-only PyTorch installs often
    have no matching torchvision, so an empty stand-in is registered when torchvision is
    missing.  Only ``MDSWriter`` and ``StreamingDataset`` are used here.
    """
    if importlib.util.find_spec("streaming") is None:
        return None
    if importlib.util.find_spec("torchvision") is None and "torchvision" not in sys.modules:
        def stub(name: str) -> types.ModuleType:
            m = types.ModuleType(name)
            m.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = m
            return m

        tv, ds, tr, fn = (stub(n) for n in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                                             "torchvision.transforms.functional"))
        ds.VisionDataset = type("VisionDataset", (), {})
        ds.CIFAR10 = None
        fn.to_tensor = None
        tv.datasets, tv.transforms, tr.functional = ds, tr, fn
    try:
        import streaming
    except ImportError as e:
        print(f"bench: mosaicml-streaming is installed but cannot be imported ({e}): its rows are skipped",
              file=sys.stderr)
        return None
    return streaming


def mds_convert(path: Path, index: RecordIndex, out: Path) -> float:
    """Seconds to write ``path``'s records as MDS shards into ``out`` (sequential source read)."""
    streaming = import_streaming()
    assert streaming is not None
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    bounds = index.bounds
    chunk = 64 << 20
    with streaming.MDSWriter(out=str(out), columns={"data": "bytes"}, compression=None) as writer, open(path, "rb") as f:
        i, n = 0, index.n
        while i < n:
            lo = int(bounds[i])
            j = int(np.searchsorted(bounds, lo + chunk, side="right")) - 1
            j = min(max(j, i + 1), n)
            f.seek(lo)
            buf = f.read(int(bounds[j]) - lo)
            offs = (bounds[i: j + 1] - lo).tolist()
            for a, b in zip(offs[:-1], offs[1:]):
                writer.write({"data": buf[a:b]})
            i = j
    _fsync_tree(out)
    return time.perf_counter() - t0


def mds_epoch(mds: Path, max_seconds: float, lock_dir: Path, seed: int = 0, epoch_salt: int = 0) -> Reading:
    """One epoch of a local ``StreamingDataset``; its file locks go to ``lock_dir`` (it puts them
    in the temporary directory and leaves them there)."""
    streaming = import_streaming()
    assert streaming is not None
    import tempfile

    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    lock_dir.mkdir(parents=True, exist_ok=True)
    saved, tempfile.tempdir = tempfile.tempdir, str(lock_dir)
    try:
        return _mds_epoch(streaming, mds, max_seconds, seed + epoch_salt)
    finally:
        tempfile.tempdir = saved
        clean_stale_shared_memory()


def _mds_epoch(streaming: types.ModuleType, mds: Path, max_seconds: float, seed: int) -> Reading:
    t0 = time.perf_counter()
    ds = streaming.StreamingDataset(local=str(mds), shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    n = nbytes = 0
    first = None
    complete = True
    deadline = t0 + max_seconds
    it = iter(ds)
    try:
        for sample in it:
            if first is None:
                first = time.perf_counter() - t0
            n += 1
            nbytes += len(sample["data"])
            if not n & 0xFFF and time.perf_counter() > deadline:
                complete = n >= len(ds)
                break
    finally:
        # a cut-short epoch leaves Streaming's download threads running: stop them here
        it.close()
        iterator = getattr(ds, "_iterator", None)
        if iterator is not None:
            iterator.exit()
        executor = getattr(ds, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)
        del it, ds
    return Reading(nbytes, n, time.perf_counter() - t0, first or 0.0, complete)


def mds_cleanup() -> None:
    streaming = import_streaming()
    if streaming is not None:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()


# --------------------------------------------------------------------------- Shuffle Once


def shuffle_once_copy(path: Path, index: RecordIndex, out: Path, seed: int = 0) -> float:
    """Seconds to write a once-shuffled copy of ``path`` to ``out`` (read, permute, write, fsync).

    Reads the whole source into memory first (the fastest way when it fits), so this is Shuffle
    Once at its best; a source larger than memory would need an external shuffle.
    """
    t0 = time.perf_counter()
    data = np.fromfile(path, dtype=np.uint8)
    plan = make_plan(index, ShuffleSpec(strategy="once", seed=seed), 0)
    fetch = slice_fetch(data)
    with open(out, "wb") as f:
        f.write(data[: index.header_end].tobytes())
        for k in range(plan.n_windows):
            f.write(assemble(index, plan.window(k), fetch))
        f.write(data[index.trailer_start:].tobytes())
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
