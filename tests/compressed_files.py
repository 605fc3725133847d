"""Realistic compressed text for the tests of compressed views: label-sorted JSON lines and CSV
rows of word-like text (about 3x compressible, as real corpora are), a few MB decoded, written as
the tools people use write them: gzip (one member, as ``gzip`` and ``pigz`` write, or many, as
``bgzip`` does), zstd in one frame (the ``zstd`` command's default, with its checksum) or in
frames of 1 MiB (``pzstd``, the seekable format).

Also `lines_of` and `label_mix`: what a reader got, and how well its order mixes the labels,
measured as ``shufflefs inspect`` measures it (`quality.label_mix_tv` per 100 records, beside a
uniform shuffle's expectation)."""

from __future__ import annotations

import csv
import gzip
import io
import json

import numpy as np
import zstandard

LABELS = 10
VOCABULARY = 4000


def _words(rng: np.random.Generator) -> list[bytes]:
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", np.uint8)
    lens = rng.integers(2, 10, VOCABULARY)
    return [bytes(letters[np.minimum(rng.geometric(0.2, n) - 1, 25)]) for n in lens]


def _texts(n: int, seed: int, lo: int = 40, hi: int = 160) -> list[str]:
    """``n`` texts of ``lo``-``hi`` words drawn by a Zipf-like law (compressible as prose is)."""
    rng = np.random.default_rng(seed)
    words = _words(rng)
    p = 1.0 / np.arange(1, VOCABULARY + 1) ** 1.05
    counts = rng.integers(lo, hi, n)
    picks = rng.choice(VOCABULARY, int(counts.sum()), p=p / p.sum())
    cuts = np.cumsum(counts)[:-1]
    return [b" ".join(words[i] for i in part).decode() for part in np.split(picks, cuts)]


def jsonl(n: int = 9000, seed: int = 0) -> bytes:
    """``n`` JSON lines ``{"id", "label", "text"}`` sorted by label (10 labels of equal count):
    about 700 bytes each, 6.3 MB for the default ``n``."""
    texts = _texts(n, seed)
    return b"".join(json.dumps({"id": i, "label": i * LABELS // n, "text": t}).encode() + b"\n"
                    for i, t in enumerate(texts))


def csv_text(n: int = 9000, seed: int = 1) -> bytes:
    """A CSV of ``n`` rows sorted by label, with a header and quoted fields holding commas,
    quotes and newlines (one row in seven)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["id", "label", "text"])
    for i, t in enumerate(_texts(n, seed, 10, 60)):
        w.writerow([i, i * LABELS // n, t + (', "quoted"\nsecond line' if i % 7 == 0 else "")])
    return out.getvalue().encode()


def gz(data: bytes, members: int = 1) -> bytes:
    """One gzip member (gzip, pigz), or ``members`` of about equal size (bgzip-like)."""
    step = -(-len(data) // members)
    return b"".join(gzip.compress(data[i: i + step], 6) for i in range(0, max(len(data), 1), step))


def zst(data: bytes, frame: int | None = None) -> bytes:
    """One zstd frame with its checksum (the ``zstd`` command), or frames of ``frame`` decoded
    bytes each (pzstd, the seekable format)."""
    c = zstandard.ZstdCompressor(level=3, write_checksum=True)
    if frame is None:
        return c.compress(data)
    return b"".join(c.compress(data[i: i + frame]) for i in range(0, len(data), frame))


def decode(name: str, data: bytes) -> bytes:
    """A whole compressed file's bytes, decoded by the codec's own reader."""
    if name.endswith(".gz"):
        return gzip.decompress(data)
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as r:
        return r.read()


def lines_of(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def labels_of(lines: list[bytes]) -> np.ndarray:
    return np.array([json.loads(line)["label"] for line in lines], np.int64)


def label_mix(labels: np.ndarray, window: int = 100) -> tuple[float, float]:
    """The label mix of an order (TV per ``window`` records: 0 is every window like the whole)
    and what a uniform shuffle is expected to get."""
    from shufflefs.quality import expected_label_mix_tv, label_mix_tv

    labels = np.asarray(labels)
    return (label_mix_tv(np.arange(len(labels)), labels, window),
            expected_label_mix_tv(np.bincount(labels, minlength=LABELS), window))
