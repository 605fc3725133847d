"""Real shufflefs mounts of a stored training set, and readers of their views epoch by epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .data import Stored, read_records
from .settings import EPOCH_XATTR, INFO_XATTR, Variant

# --------------------------------------------------------------------------- mounts


def shufflefs_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "shufflefs", *args]


def unmount(mnt: Path) -> None:
    """Unmount, falling back to a lazy unmount so that nothing is left behind."""
    r = subprocess.run(shufflefs_cmd("umount", str(mnt)), capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)


@contextmanager
def mounted(src: Path, mnt: Path, cache: Path, args: Sequence[str], log: Path | None = None) -> Iterator[Path]:
    """A real shufflefs mount of ``src`` at ``mnt`` for the duration of the block."""
    mnt.mkdir(parents=True, exist_ok=True)
    cmd = shufflefs_cmd("mount", str(src), str(mnt), "--cache-dir", str(cache), *args)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd += ["--log-file", str(log)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        unmount(mnt)
        raise
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    try:
        yield mnt
    finally:
        unmount(mnt)


def set_epoch(mnt: Path, epoch: int) -> None:
    os.setxattr(mnt, EPOCH_XATTR, str(epoch).encode())


def interleave(parts: Sequence[tuple[np.ndarray, np.ndarray]], micro: int) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel SGD seen from the model: step i takes micro-batch i of every rank in turn
    (CorgiPile §5, Fig. 5); a rank whose share is used up contributes nothing."""
    lens = np.array([len(y) for _, y in parts], np.int64)
    if not lens.sum():
        return parts[0]
    rank = np.repeat(np.arange(len(parts)), lens)
    pos = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
    order = np.lexsort((pos, rank, pos // micro))
    return np.concatenate([x for x, _ in parts])[order], np.concatenate([y for _, y in parts])[order]


Reader = Callable[[int], tuple[np.ndarray, np.ndarray]]


@contextmanager
def view_reader(stored: Stored, variant: Variant, work: Path, seed: int, batch: int) -> Iterator[Reader]:
    """``reader(epoch)`` -> the training records of that epoch in the order the mount serves them.

    With ``variant.world`` > 1 every simulated rank has its own mount and the ranks' records are
    interleaved micro-batch by micro-batch, as data-parallel SGD consumes them.
    """
    chosen = ["--strategy", variant.strategy, "--buffer", variant.buffer] if variant.strategy else []
    base = [*chosen, "--seed", str(seed), *stored.mount_args(bool(variant.strategy)), *variant.extra]
    tag = f"{stored.src.name}-{variant.label.replace('%', 'pc')}"
    with ExitStack() as stack:
        mnts = []
        for r in range(variant.world):
            args = base + (["--rank", str(r), "--world", str(variant.world)] if variant.world > 1 else [])
            mnts.append(stack.enter_context(mounted(stored.src, work / "mnt" / f"{tag}-r{r}", work / "cache",
                                                    args, work / "logs" / f"{tag}-r{r}.log")))

        def read(epoch: int) -> tuple[np.ndarray, np.ndarray]:
            parts = []
            for mnt in mnts:
                set_epoch(mnt, epoch)
                parts.append(read_records(mnt / stored.file, stored.fmt, stored.data.dim))
            if len(parts) == 1:
                return parts[0]
            return interleave(parts, max(1, batch // len(parts)))

        read.info = json.loads(os.getxattr(mnts[0] / stored.file, INFO_XATTR))  # what the view resolved
        yield read
