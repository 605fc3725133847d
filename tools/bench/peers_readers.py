"""The contenders of the peers race that run in the main venv (see `peers_child`).

Every contender yields batches as ``(ids, labels)`` lists taken from records it decoded itself
(``json.loads`` of the line, or the reader's own decoding of the same fields), so each does the
same work per sample.  DataLoader contenders decode in their workers and hand the records over,
as a training loop would get them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

BATCH = 64
WORKERS = 2
EPOCH_XATTR = "user.shufflefs.epoch"
INFO_XATTR = "user.shufflefs.info"


def _pairs(records: list) -> tuple[list, list]:
    return [r["id"] for r in records], [r["label"] for r in records]


def _collate(batch: list) -> list:
    return batch


def _decode_sample(sample: dict) -> dict:
    return json.loads(sample["json"])


def loader_batches(loader):
    it = iter(loader)
    try:
        for batch in it:
            yield _pairs(batch)
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del it


def record_batches(lines):
    """``(ids, labels)`` of every `BATCH` of JSON ``lines``, each decoded with ``json.loads``."""
    loads = json.loads
    ids: list = []
    labels: list = []
    for line in lines:
        r = loads(line)
        ids.append(r["id"])
        labels.append(r["label"])
        if len(ids) == BATCH:
            yield ids, labels
            ids, labels = [], []
    if ids:
        yield ids, labels


def line_batches(path: Path):
    """A Python loop over the lines of ``path`` (reads of its ``st_blksize``), ``json.loads`` each."""
    with open(path, "rb", buffering=max(os.stat(path).st_blksize, 8192)) as f:
        yield from record_batches(f)


def newline_bounds(path: Path) -> np.ndarray:
    """Record bounds of a line file: 0, then the offset after every newline (a chunked scan)."""
    ends = [np.zeros(1, np.int64)]
    with open(path, "rb") as f:
        pos = 0
        while chunk := f.read(64 << 20):
            ends.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10).astype(np.int64) + pos + 1)
            pos += len(chunk)
    return np.concatenate(ends)


class Contender:
    config = ""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.n = int(cfg["n"])
        self.src = Path(cfg["jsonl"])
        self.work = Path(cfg["work"])
        self.work.mkdir(parents=True, exist_ok=True)
        self.info: dict = {}

    def prepare(self) -> str:
        return ""

    def files(self) -> list[Path]:
        return [self.src]

    def close(self, it) -> None:
        close = getattr(it, "close", None)
        if close is not None:
            close()

    def finish(self) -> None:
        pass


# --------------------------------------------------------------------------- shufflefs


class Shufflefs(Contender):
    """A mount made by the parent (``cfg["mnt"]``); the epoch is set on its root before each pass."""

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        self.mnt = Path(cfg["mnt"])
        self.view = self.mnt / cfg.get("view", self.src.name)

    def set_epoch(self, epoch: int) -> None:
        os.setxattr(self.mnt, EPOCH_XATTR, str(epoch).encode())

    def prepare(self) -> str:
        self.set_epoch(0)
        self.info = json.loads(os.getxattr(self.view, INFO_XATTR))
        return ""


class ShufflefsLoop(Shufflefs):
    config = "a Python loop over the view's lines (1 MiB reads), `json.loads` each"

    def batches(self, epoch: int):
        self.set_epoch(epoch)
        return line_batches(self.view)


class ShufflefsParts(Shufflefs):
    config = (f"`shufflefs.torch.LineDataset` through a DataLoader, {WORKERS} workers each reading its "
              f"part `.parts/{WORKERS}/i/` (json.loads in the workers), batches of {BATCH}")

    def batches(self, epoch: int):
        from torch.utils.data import DataLoader

        from shufflefs.torch import LineDataset, set_epoch

        set_epoch(self.mnt, epoch)
        ds = LineDataset(self.mnt, [self.view.relative_to(self.mnt).as_posix()])
        return loader_batches(DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate))


class ShufflefsWds(Shufflefs):
    config = (f"`webdataset.WebDataset(views, shardshuffle=False)` over the tar shards' views (one pool), "
              f"`.map(json.loads of the .json member).batched({BATCH})`, `WebLoader`, {WORKERS} workers "
              "(whole shards per worker)")

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        self.shards = [self.mnt / s for s in cfg["shards"]]
        self.view = self.shards[0]

    def files(self) -> list[Path]:
        return [Path(cfg) for cfg in self.cfg["shard_sources"]]

    def batches(self, epoch: int):
        import webdataset as wds

        self.set_epoch(epoch)
        ds = (wds.WebDataset([str(s) for s in self.shards], shardshuffle=False, empty_check=False)
              .map(_decode_sample).batched(BATCH, collation_fn=_collate))
        return loader_batches(wds.WebLoader(ds, batch_size=None, num_workers=WORKERS))


# --------------------------------------------------------------------------- peers


def _pread_dataset_class():
    from torch.utils.data import Dataset

    from bench.alternatives import PreadRecords

    class PreadJson(PreadRecords, Dataset):
        def __getitem__(self, i: int) -> dict:
            return json.loads(super().__getitem__(i))

    return PreadJson


class Pread(Contender):
    config = (f"map-style Dataset, one `os.pread` per record through an offset table built by a "
              f"newline scan (in memory, 8 B/record), `json.loads`; `RandomSampler`, DataLoader with "
              f"{WORKERS} workers, batches of {BATCH}")

    def prepare(self) -> str:
        bounds = newline_bounds(self.src)
        self.ds = _pread_dataset_class()(self.src, SimpleNamespace(bounds=bounds, lengths=np.diff(bounds)))
        return ""

    def batches(self, epoch: int):
        import torch
        from torch.utils.data import DataLoader, RandomSampler

        gen = torch.Generator()
        gen.manual_seed(epoch)
        return loader_batches(DataLoader(self.ds, batch_size=BATCH, sampler=RandomSampler(self.ds, generator=gen),
                                         num_workers=WORKERS, collate_fn=_collate))


class HfMap(Contender):
    config = (f"`load_dataset(\"json\")` (Arrow cache), then every epoch `.shuffle(seed=epoch)` "
              f"(an indices mapping) read by `.iter(batch_size={BATCH})` in the main process")

    def prepare(self) -> str:
        import datasets

        datasets.disable_progress_bars()
        self.ds = datasets.load_dataset("json", data_files=str(self.src), split="train",
                                        cache_dir=str(self.work / "hf"))
        return ""

    def files(self) -> list[Path]:
        return [self.work / "hf"]

    def batches(self, epoch: int):
        shuffled = self.ds.shuffle(seed=epoch)
        return ((b["id"], b["label"]) for b in shuffled.iter(batch_size=BATCH))


class HfIterable(HfMap):
    SHARDS = 64

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        self.buffer = int(cfg["buffer_records"]) // WORKERS
        self.config = (f"`load_dataset(\"json\")`, `.to_iterable_dataset(num_shards={self.SHARDS})"
                       f".shuffle(seed=0, buffer_size={self.buffer:,})`, `set_epoch(epoch)`, DataLoader with "
                       f"{WORKERS} workers (a buffer each: {WORKERS * self.buffer:,} records in all), "
                       f"batches of {BATCH}")

    def batches(self, epoch: int):
        from torch.utils.data import DataLoader

        ids = self.ds.to_iterable_dataset(num_shards=self.SHARDS).shuffle(seed=0, buffer_size=self.buffer)
        ids.set_epoch(epoch)
        return loader_batches(DataLoader(ids, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate))


class Wds(Contender):
    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        self.shards = [Path(s) for s in cfg["shard_sources"]]
        self.buffer = int(cfg["buffer_records"]) // WORKERS
        self.config = (f"`webdataset.WebDataset(shards, shardshuffle=100, seed=epoch).shuffle({self.buffer:,})"
                       f".map(json.loads of the .json member).batched({BATCH})`, `WebLoader`, {WORKERS} workers "
                       f"(a buffer each: {WORKERS * self.buffer:,} samples in all; `initial` left at its "
                       f"default), {len(self.shards)} shards of ~64 MB")

    def files(self) -> list[Path]:
        return self.shards

    def batches(self, epoch: int):
        import webdataset as wds

        ds = (wds.WebDataset([str(s) for s in self.shards], shardshuffle=100, seed=epoch, empty_check=False)
              .shuffle(self.buffer).map(_decode_sample).batched(BATCH, collation_fn=_collate))
        return loader_batches(wds.WebLoader(ds, batch_size=None, num_workers=WORKERS))


def _lit_records(arg: tuple[str, int, int]):
    """litdata's optimize() function: the lines of one byte range of the source."""
    path, lo, hi = arg
    with open(path, "rb") as f:
        f.seek(lo)
        data = f.read(hi - lo)
    for line in data.splitlines():
        yield {"line": line.decode()}


class Litdata(Contender):
    config = (f"`litdata.optimize(fn, inputs=4 MB line ranges, chunk_bytes=\"64MB\", num_workers={WORKERS})`, "
              f"then `StreamingDataset(dir, shuffle=True)` (chunk order and items within chunk intervals "
              f"shuffled; no sample-buffer knob), `set_epoch(epoch)`, `StreamingDataLoader` with {WORKERS} "
              f"workers, batches of {BATCH}, `json.loads` of each item")

    def prepare(self) -> str:
        import litdata

        bounds = newline_bounds(self.src)
        cuts = np.unique(np.concatenate([bounds[np.searchsorted(bounds, np.arange(0, bounds[-1], 4 << 20))],
                                         bounds[-1:]]))
        inputs = [(str(self.src), int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]
        self.out = self.work / "litdata"
        os.environ.setdefault("DATA_OPTIMIZER_CACHE_FOLDER", str(self.work / "lit-cache"))
        litdata.optimize(fn=_lit_records, inputs=inputs, output_dir=str(self.out), chunk_bytes="64MB",
                         num_workers=WORKERS, verbose=False, mode="overwrite")
        self.ds = litdata.StreamingDataset(str(self.out), shuffle=True, seed=0,
                                           cache_dir=str(self.work / "lit-cache"))
        return ""

    def files(self) -> list[Path]:
        return [self.out]

    def batches(self, epoch: int):
        import litdata

        self.ds.set_epoch(epoch + 1)
        loader = litdata.StreamingDataLoader(self.ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_decode_lit)
        return loader_batches(loader)


def _decode_lit(batch: list) -> list:
    return [json.loads(item["line"]) for item in batch]


CONTENDERS = {
    "shufflefs-loop": ShufflefsLoop,
    "shufflefs-parts": ShufflefsParts,
    "shufflefs-wds": ShufflefsWds,
    "pread": Pread,
    "hf-map": HfMap,
    "hf-iterable": HfIterable,
    "wds": Wds,
    "litdata": Litdata,
}
