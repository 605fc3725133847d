"""The peers race's dataset and its order metrics.

One JSON Lines file of ``n`` records of about 1 KB, sorted by a ``label`` field with 10 labels
(record ``i`` has ``id`` i and label ``i * 10 // n``), and the same records written as WebDataset
tar shards of about 64 MB (one ``KEY.json`` member per sample, in the same order).

The label mix of a read is measured against the whole set's label histogram, over consecutive
windows of `MIX_WINDOW` samples; the gap entropy is `shufflefs.quality.gap_entropy` of the ids read.
"""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import numpy as np

from shufflefs.quality import metrics as quality

LABELS = 10
MIX_WINDOW = 1000
JSONL = "train.jsonl"
SHARD_BYTES = 64 << 20
TAR_BLOCK = 512


def label_of(ids: np.ndarray, n: int) -> np.ndarray:
    return (np.asarray(ids, np.int64) * LABELS) // n


def make_jsonl(path: Path, n: int, seed: int = 0) -> None:
    """``n`` label-sorted records of 800..1250 bytes, each line ``{"id": i, "label": l, "text": "..."}``."""
    rnd = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 ", np.uint8)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        for first in range(0, n, 8192):
            ids = np.arange(first, min(n, first + 8192))
            pads = rnd.integers(760, 1210, len(ids))
            text = letters[rnd.integers(0, len(letters), int(pads.sum()))].tobytes()
            parts, pos = [], 0
            for i, lab, p in zip(ids.tolist(), label_of(ids, n).tolist(), pads.tolist()):
                parts.append(b'{"id": %d, "label": %d, "text": "%s"}\n' % (i, lab, text[pos: pos + p]))
                pos += p
            f.write(b"".join(parts))
    os.replace(tmp, path)


def write_shards(src: Path, out: Path, shard_bytes: int = SHARD_BYTES) -> tuple[list[Path], float]:
    """The lines of ``src`` as WebDataset shards ``shard-NNNNNN.tar`` of about ``shard_bytes``
    each (a sample per line: member ``KEY.json`` holding the line without its newline); returns
    the shards and the seconds it took (fsynced)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    shards: list[Path] = []
    f = None
    size = 0
    pad = b"\0" * TAR_BLOCK
    try:
        with open(src, "rb", buffering=1 << 20) as lines:
            for key, line in enumerate(lines):
                if f is None or size >= shard_bytes:
                    if f is not None:
                        _close_shard(f)
                    shards.append(out / f"shard-{len(shards):06d}.tar")
                    f, size = open(shards[-1], "wb", buffering=1 << 20), 0
                body = line.rstrip(b"\n")
                info = tarfile.TarInfo(f"{key:09d}.json")
                info.size, info.mtime, info.mode = len(body), 0, 0o644
                rec = info.tobuf(format=tarfile.USTAR_FORMAT) + body + pad[: -len(body) % TAR_BLOCK]
                f.write(rec)
                size += len(rec)
    finally:
        if f is not None:
            _close_shard(f)
    return shards, time.perf_counter() - t0


def _close_shard(f) -> None:
    f.write(b"\0" * (2 * TAR_BLOCK))
    f.flush()
    os.fsync(f.fileno())
    f.close()


def du(*paths: Path) -> int:
    """Bytes allocated on disk under ``paths`` (files and directories; missing ones count 0)."""
    total = 0
    for p in paths:
        p = Path(p)
        if p.is_file():
            total += p.stat().st_blocks * 512
        elif p.is_dir():
            for dirpath, _dirs, files in os.walk(p):
                for name in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                    except OSError:
                        pass
    return total


# --------------------------------------------------------------------------- order metrics


def label_mix(labels: np.ndarray, whole: np.ndarray, k: int = MIX_WINDOW) -> float:
    """Mean total-variation distance between the label histogram of each full window of ``k``
    consecutive samples and ``whole`` (the whole set's label shares, summing to 1).

    The same measure as `shufflefs.quality.label_mix_tv`, whose reference is the histogram of
    the order it is given; here the reference is the whole data set's, so a read that saw only
    some labels is not judged against its own skewed mix."""
    lab = np.asarray(labels, np.int64)
    windows = len(lab) // k
    if windows == 0:
        return float("nan")
    keys = np.arange(windows * k, dtype=np.int64) // k * len(whole) + lab[: windows * k]
    counts = np.bincount(keys, minlength=windows * len(whole)).reshape(windows, len(whole))
    return float((0.5 * np.abs(counts / k - whole[None, :]).sum(axis=1)).mean())


def whole_shares(n: int) -> np.ndarray:
    return np.bincount(label_of(np.arange(n), n), minlength=LABELS) / n


def order_metrics(ids: np.ndarray, labels: np.ndarray, n: int, upto: int) -> dict:
    """Label mix and gap entropy of the first ``upto`` samples read."""
    ids, labels = np.asarray(ids, np.int64)[:upto], np.asarray(labels, np.int64)[:upto]
    return {"samples": int(len(ids)), "mix": label_mix(labels, whole_shares(n)),
            "entropy": quality.gap_entropy(ids) if len(ids) > 1 else float("nan"),
            "labels_seen": int(len(np.unique(labels)))}


def uniform_reference(n: int, upto: int, seed: int = 12345) -> dict:
    """The same metrics of the first ``upto`` records of a numpy uniform permutation of all ``n``,
    and the exact expected label mix of a uniform shuffle."""
    perm = np.random.default_rng(seed).permutation(n)[:upto]
    out = order_metrics(perm, label_of(perm, n), n, upto)
    out["expected_mix"] = quality.expected_label_mix_tv(np.bincount(label_of(np.arange(n), n)), MIX_WINDOW)
    return out
