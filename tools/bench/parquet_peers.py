"""The loaders Parquet views are compared with (HF ``datasets``, litdata's Parquet streaming),
and the label mix every row of `parquet_views` reports, theirs included."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

LABELS = 10


def label_mix(labels: np.ndarray) -> tuple[float, float]:
    """Label mix per 100 rows of an order (0: every 100 rows like the whole) and a uniform
    shuffle's expected one."""
    from shufflefs.quality import expected_label_mix_tv, label_mix_tv

    return (label_mix_tv(np.arange(len(labels)), labels, 100),
            expected_label_mix_tv(np.bincount(labels, minlength=LABELS), 100))


def hf_datasets(src: Path, cap: int) -> list[str]:
    """``datasets.load_dataset('parquet')``, ``.shuffle()``, batches of 1,000: rows/s over the
    first ``cap`` rows, and their label mix."""
    try:
        import datasets
    except ImportError:
        return ["HF datasets: not installed."]
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        ds = datasets.load_dataset("parquet", data_files=str(src), split="train", cache_dir=cache)
        load = time.perf_counter() - t0
        t0 = time.perf_counter()
        shuffled = ds.shuffle(seed=0)
        labels, n = [], 0
        for batch in shuffled.iter(batch_size=1000):
            labels.append(np.asarray(batch["label"]))
            n += len(batch["label"])
            if n >= cap:
                break
        took = time.perf_counter() - t0
    mix, uniform = label_mix(np.concatenate(labels))
    return [f"| HF datasets `.shuffle()` then `.iter(batch_size=1000)` (first {n:,} rows; `load_dataset` "
            f"converted the file in {load:.1f} s first) | {n / took:,.0f} | - | {mix:.3f} ({uniform:.3f}) | - | - |"]


def litdata_parquet(src: Path, cap: int) -> list[str]:
    """litdata's Parquet streaming as its docs show it (``index_parquet_dataset``, then a
    ``StreamingDataset`` with ``ParquetLoader`` and ``shuffle=True``, default arguments
    otherwise): rows/s over the first ``cap`` rows, and their label mix."""
    try:
        import litdata
        from litdata.streaming.item_loader import ParquetLoader
    except ImportError:
        return ["litdata: not installed."]
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        litdata.index_parquet_dataset(str(src.parent), cache_dir=cache)
        index = time.perf_counter() - t0
        ds = litdata.StreamingDataset(str(src.parent), item_loader=ParquetLoader(), shuffle=True, seed=0,
                                      index_path=os.path.join(cache, "index.json"))
        labels = np.empty(cap, np.int64)
        n = 0
        t0 = time.perf_counter()
        for row in ds:
            labels[n] = row["label"]
            n += 1
            if n >= cap:
                break
        took = time.perf_counter() - t0
    mix, uniform = label_mix(labels[:n])
    return [f"| litdata `StreamingDataset(ParquetLoader(), shuffle=True)` (first {n:,} rows; "
            f"`index_parquet_dataset` took {index:.1f} s first) | {n / took:,.0f} | - | {mix:.3f} ({uniform:.3f}) | - | - |"]
