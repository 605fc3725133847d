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

Each reader stops after ``max_seconds`` like `reads.Reading`.  ``run_torch``, ``run_streaming`` and
``run_once_copy`` add their rows to a benchmark run.
"""

from __future__ import annotations

import os
import shutil
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from shufflefs.index.table import RecordIndex
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.windows.layout import assemble, slice_fetch

from . import reads
from .reads import Reading
from .streaming_import import import_streaming

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


# --------------------------------------------------------------------------- the run's rows
# (functions of the benchmark run ``b``, a `Bench`)


def run_torch(b: Any) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    for ds in b.datasets:
        for w in [int(x) for x in b.args.workers.split(",") if x.strip()]:
            what = f"pread Dataset, {w} workers"
            for cache in b.caches:
                if torch is None:
                    b.skip(ds, what, "random", cache, "torch not installed")
                    continue
                b.measure(ds.row(what, "random", cache),
                             lambda: pread_dataset(ds.path, ds.index, w, b.args.max_seconds),
                             warm=(ds.path,))


def run_streaming(b: Any) -> None:
    if import_streaming() is None:
        for ds in b.datasets:
            for what, cache in [("MosaicML MDS conversion", "warm")] + [("MosaicML epoch", c) for c in b.caches]:
                b.skip(ds, what, "py1e", cache, "mosaicml-streaming not installed")
        return
    try:
        for ds in b.datasets:
            out = b.work / "mds" / ds.name
            reads.warm(ds.path)
            secs = mds_convert(ds.path, ds.index, out)
            conv = b.report.add(ds.row("MosaicML MDS conversion", "write", "warm",
                                          reading=Reading(ds.size, ds.n, secs, secs, True),
                                          note="sequential source read, one sample per record, fsynced"))
            b.say(f"{ds.name:6} MDS conversion {secs:.2f} s")
            for i, cache in enumerate(b.caches):
                row = b.measure(ds.row("MosaicML epoch", "py1e", cache),
                                   lambda: mds_epoch(out, b.args.max_seconds, b.work / "locks", epoch_salt=i),
                                   warm=tuple(out.rglob("*.mds")))
                first = row.reading
                b.report.add(ds.row("MosaicML epoch 1 incl. conversion", "py1e", cache,
                                       reading=Reading(first.nbytes, first.records, first.seconds, first.first_s,
                                                       first.complete),
                                       extra_s=conv.reading.seconds, note="conversion counted"))
            shutil.rmtree(out, ignore_errors=True)
    finally:
        mds_cleanup()


def run_once_copy(b: Any) -> None:
    outdir = b.work / "once"
    outdir.mkdir(exist_ok=True)
    for ds in b.datasets:
        copy = outdir / ds.path.name
        reads.warm(ds.path)
        secs = shuffle_once_copy(ds.path, ds.index, copy, b.args.seed)
        rewrite = b.report.add(ds.row("Shuffle Once rewrite", "write", "warm",
                                         reading=Reading(ds.size, ds.n, secs, secs, True),
                                         note="source read into memory, permuted, written, fsynced"))
        b.say(f"{ds.name:6} Shuffle Once rewrite {secs:.2f} s")
        for rd in ("1MiB", "loop"):
            if rd not in b.readers:
                continue
            fn = reads.reader(rd, ds.record_size)
            for cache in b.caches:
                row = b.measure(ds.row("Shuffle Once copy", rd, cache), lambda: fn(copy, b.args.max_seconds),
                                   warm=(copy,))
                if rd == "loop":
                    r = row.reading
                    b.report.add(ds.row("Shuffle Once epoch 1 incl. rewrite", rd, cache,
                                           reading=Reading(r.nbytes, r.records, r.seconds, r.first_s, r.complete),
                                           extra_s=rewrite.reading.seconds, note="rewrite counted"))
        copy.unlink()
