"""The benchmark's datasets, generated reproducibly from a seed.

JSON Lines of about 1 KiB per line (variable length), fixed-size binary records, and a file of
many short lines for the remount test.  Generation is vectorised or chunked so that 2 GiB take
seconds, not minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

LINES_NAME = "lines.jsonl"
FIXED_NAME = "fixed.bin"
SHORT_NAME = "short.txt"
FIXED_RECORD = 3072
CHUNK = 32 << 20


def _bar(path: Path, total: int) -> tqdm:
    """Bytes written so far (on a terminal only: logs of a run stay free of bar redraws)."""
    return tqdm(total=total, unit="B", unit_scale=True, desc=f"generating {path.name}", disable=None, leave=False)


LABELS = 10
LINE_BYTES = 1020
"""About the mean length of a generated line: labels are cut at multiples of size / this."""


def line_labels(ids: np.ndarray, size: int) -> np.ndarray:
    """The ``label`` of the generated lines ``ids`` of a file of ``size`` bytes: sorted, 10 labels
    of about equal count (the case where the order matters most for training)."""
    n = max(1, size // LINE_BYTES)
    return np.minimum(np.asarray(ids, np.int64) * LABELS // n, LABELS - 1)


def make_lines(path: Path, size: int, seed: int = 0) -> None:
    """JSONL records of 800..1250 bytes (about 1 KiB), at least ``size`` bytes in total, sorted by
    ``label`` (`line_labels`)."""
    rnd = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
    written, i = 0, 0
    with open(path, "wb") as f, _bar(path, size) as bar:
        while written < size:
            pads = rnd.integers(760, 1210, 4096)
            text = letters[rnd.integers(0, len(letters), int(pads.sum()))].tobytes()
            parts, pos = [], 0
            labels = line_labels(np.arange(i, i + len(pads)), size).tolist()
            for j, p in enumerate(pads.tolist()):
                parts.append(b'{"id": %d, "label": %d, "text": "%s"}\n' % (i + j, labels[j], text[pos: pos + p]))
                pos += p
            chunk = b"".join(parts)
            f.write(chunk)
            written += len(chunk)
            bar.update(len(chunk))
            i += len(pads)


def make_fixed(path: Path, size: int, record_size: int = FIXED_RECORD, seed: int = 0) -> None:
    """Whole records of ``record_size`` random bytes, each starting with its number (uint64)."""
    rnd = np.random.default_rng(seed)
    n = max(1, -(-size // record_size))
    per_chunk = max(1, CHUNK // record_size)
    with open(path, "wb") as f, _bar(path, n * record_size) as bar:
        for first in range(0, n, per_chunk):
            m = min(per_chunk, n - first)
            rec = np.frombuffer(rnd.bytes(m * record_size), np.uint8).reshape(m, record_size).copy()
            rec[:, :8] = np.arange(first, first + m, dtype="<u8").view(np.uint8).reshape(m, 8)
            f.write(rec.tobytes())
            bar.update(m * record_size)


def make_short_lines(path: Path, n: int, width: int = 9) -> None:
    """``n`` lines of ``width`` bytes (the line number in 8 digits, padded with dots, and a
    newline): many records in a small file."""
    if width < 9:
        raise ValueError("lines need at least 9 bytes")
    per_chunk = 1 << 20
    with open(path, "wb") as f:
        for first in range(0, n, per_chunk):
            ids = np.arange(first, min(n, first + per_chunk), dtype=np.int64)
            out = np.full((len(ids), width), ord("."), np.uint8)
            for d in range(8):
                out[:, 7 - d] = ord("0") + (ids // 10**d) % 10
            out[:, width - 1] = ord("\n")
            f.write(out.tobytes())


def ensure(path: Path, make, *args) -> bool:
    """Create ``path`` with ``make(path, *args)`` unless it exists; True if it was generated."""
    if path.exists():
        return False
    tmp = path.with_name(path.name + ".partial")
    make(tmp, *args)
    os.replace(tmp, path)
    return True
