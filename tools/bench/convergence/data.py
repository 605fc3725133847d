"""The label-sorted training sets, written as JSON lines or fixed-size records and read back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .settings import READ_CHUNK

# --------------------------------------------------------------------------- datasets


@dataclass
class Data:
    """A training set sorted by label (the order written to the files) and its test set."""

    name: str
    x_train: np.ndarray  # float32 (n, d)
    y_train: np.ndarray  # int64 (n,)
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    decimals: int | None
    """Digits after the point in JSONL; None writes integers. Features are rounded to it."""
    seed: int = 0

    @property
    def dim(self) -> int:
        return self.x_train.shape[1]


def label_sorted(name: str, x: np.ndarray, y: np.ndarray, test_size: int | float, seed: int,
                 decimals: int | None) -> Data:
    """Split off a stratified test set, then sort the training set by label (stably)."""
    from sklearn.model_selection import train_test_split

    x = (np.round(x, decimals) if decimals is not None else x).astype(np.float32)
    y = y.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, stratify=y, random_state=seed)
    order = np.argsort(y_tr, kind="stable")
    return Data(name, np.ascontiguousarray(x_tr[order]), y_tr[order], x_te, y_te, int(y.max()) + 1, decimals, seed)


def digits_data(seed: int = 0) -> Data:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return label_sorted("digits", x, y, 0.2, seed, None)


def synthetic_data(rows: int = 1_000_000, seed: int = 0) -> Data:
    """A binary problem that a linear model solves to ~80% and an MLP to more; ``rows`` train rows."""
    from sklearn.datasets import make_classification

    test = max(rows // 4, 2)
    x, y = make_classification(n_samples=rows + test, n_features=20, n_informative=10, n_redundant=4,
                               n_clusters_per_class=2, flip_y=0.02, class_sep=1.0, random_state=seed)
    return label_sorted("synthetic", x, y, test, seed, 4)


def load_data(name: str, rows: int, seed: int) -> Data:
    return digits_data(seed) if name == "digits" else synthetic_data(rows, seed)


# --------------------------------------------------------------------------- files


def record_dtype(dim: int) -> np.dtype:
    """A fixed-size record: ``dim`` little-endian float32 features, then the int32 label."""
    return np.dtype([("x", "<f4", (dim,)), ("label", "<i4")])


def write_fixed(path: Path, x: np.ndarray, y: np.ndarray) -> int:
    """Write the records; returns the record size in bytes."""
    rec = np.empty(len(y), record_dtype(x.shape[1]))
    rec["x"], rec["label"] = x, y
    rec.tofile(path)
    return rec.dtype.itemsize


def jsonl_line_format(dim: int, decimals: int | None) -> str:
    num = "%d" if decimals is None else f"%.{decimals}f"
    return '{"label": %d, "x": [' + ", ".join([num] * dim) + "]}\n"


def write_jsonl(path: Path, x: np.ndarray, y: np.ndarray, decimals: int | None, chunk: int = 100_000) -> None:
    """One JSON object per line, ``{"label": 3, "x": [...]}``, features as ``decimals`` fixed-point."""
    fmt = jsonl_line_format(x.shape[1], decimals)
    with open(path, "w") as f:
        for lo in range(0, len(y), chunk):
            xs = x[lo:lo + chunk].astype(np.float64)
            if decimals is None:
                xs = xs.astype(np.int64)
            rows = np.concatenate([y[lo:lo + chunk, None].astype(xs.dtype), xs], axis=1)
            f.write("".join(fmt % tuple(r) for r in rows.tolist()))


_JSON_PUNCT = bytes.maketrans(b'{}[]:,"', b"       ")


def parse_jsonl(buf: bytes, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Records of whole JSONL lines, in order, by a numeric parse of the line layout
    `write_jsonl` uses (a ``json.loads`` per line would cost twice as much at 1 M rows).

    The layout is checked: the first line through ``json``, every line by the number count.
    """
    if not buf:
        return np.empty((0, dim), np.float32), np.empty(0, np.int64)
    n = buf.count(b"\n")
    first = json.loads(buf[: buf.index(b"\n")])
    if list(first) != ["label", "x"] or len(first["x"]) != dim:
        raise ValueError(f"unexpected JSONL record layout: {buf[:80]!r}")
    nums = np.fromstring(buf.translate(_JSON_PUNCT, b"labelx"), dtype=np.float64, sep=" ")
    if nums.size != n * (dim + 1):
        raise ValueError(f"{n} lines but {nums.size} numbers (expected {dim + 1} per line)")
    nums = nums.reshape(n, dim + 1)
    return nums[:, 1:].astype(np.float32), nums[:, 0].astype(np.int64)


def read_records(path: Path, fmt: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Read a training file front to back with ordinary file reads; records in file order."""
    xs, ys = [], []
    if fmt == "fixed":
        dt = record_dtype(dim)
        chunk = max(1, READ_CHUNK // dt.itemsize) * dt.itemsize
        rest = b""
        with open(path, "rb", buffering=0) as f:
            while data := f.read(chunk):
                data = rest + data
                cut = len(data) - len(data) % dt.itemsize
                rest = data[cut:]
                rec = np.frombuffer(data[:cut], dt)
                xs.append(rec["x"])
                ys.append(rec["label"].astype(np.int64))
        if rest:
            raise ValueError(f"{path}: {len(rest)} bytes after the last whole record")
    else:
        rest = b""
        with open(path, "rb", buffering=0) as f:
            while data := f.read(READ_CHUNK):
                data = rest + data
                cut = data.rfind(b"\n") + 1
                rest = data[cut:]
                x, y = parse_jsonl(data[:cut], dim)
                xs.append(x)
                ys.append(y)
        if rest:
            x, y = parse_jsonl(rest + b"\n", dim)
            xs.append(x)
            ys.append(y)
    if not xs:
        return np.empty((0, dim), np.float32), np.empty(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys)


@dataclass(frozen=True)
class Stored:
    """A training set written in one format: its directory (the mount source) and block size."""

    data: Data
    fmt: str
    src: Path
    record_size: int | None
    block_size: int
    blocks: int

    @property
    def file(self) -> str:
        return "train.bin" if self.fmt == "fixed" else "train.jsonl"

    def mount_args(self, block_size: bool = True) -> list[str]:
        args = ["--block-size", str(self.block_size)] if block_size else []
        if self.record_size is not None:
            args += ["--record-size", str(self.record_size)]
        return args


def store(data: Data, fmt: str, root: Path, blocks: int) -> Stored:
    """Write ``data``'s training set as ``fmt`` under ``root`` (reused if already there) and pick
    a block size that cuts it into about ``blocks`` blocks of whole-ish records."""
    src = root / f"{data.name}-{len(data.y_train)}-seed{data.seed}-{fmt}"
    src.mkdir(parents=True, exist_ok=True)
    path = src / ("train.bin" if fmt == "fixed" else "train.jsonl")
    n = len(data.y_train)
    record_size = record_dtype(data.dim).itemsize if fmt == "fixed" else None
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        if fmt == "fixed":
            write_fixed(tmp, data.x_train, data.y_train)
        else:
            write_jsonl(tmp, data.x_train, data.y_train, data.decimals)
        tmp.rename(path)
    size = path.stat().st_size
    per_block = max(1, round(n / blocks))
    block_size = per_block * record_size if record_size else max(1, round(size / n * per_block))
    return Stored(data, fmt, src, record_size, block_size, -(-size // block_size))
