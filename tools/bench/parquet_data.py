"""The label-sorted Parquet file the Parquet sections read (generated once into their ``--data``).

Columns: id, label (10 labels, sorted), a text, a score, a list<int32> and a dictionary-encoded
string; snappy, row groups of ``--group-rows`` rows, as pyarrow writes them.  Two kinds of text
(``--text``):

* ``letters``: 50-1000 random letters and spaces a row.  Snappy cannot shorten it, so the source
  is about as large as its decoded rows (and as a view, PLAIN and uncompressed).
* ``words``: 10-179 words a row drawn from a vocabulary of 50,000 by a Zipf law (exponent 1.15),
  as prose is; snappy halves it, as it does text corpora, so the source's reader decompresses
  about twice the source's bytes, and a view (PLAIN, uncompressed) is about twice the source.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

LABELS = 10
TEXTS = ("letters", "words")
KIND_KEY = b"shufflefs-bench-text"
"""The schema metadata key that says which text a generated file holds."""
VOCABULARY = 50_000


def ensure_data(path: Path, rows: int, group_rows: int, text: str = "letters") -> None:
    """Generate the file at ``path`` unless it holds ``rows`` rows of this ``text`` already."""
    import pyarrow.parquet as pq

    if path.exists():
        pf = pq.ParquetFile(path)
        meta = pf.schema_arrow.metadata or {}
        if pf.metadata.num_rows == rows and meta.get(KIND_KEY, b"letters").decode() == text:
            return
    make_data(path, rows, group_rows, text)


def make_data(path: Path, rows: int, group_rows: int, text: str = "letters", seed: int = 0) -> None:
    """The label-sorted file (the module docstring), one row group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if text not in TEXTS:
        raise ValueError(f"text must be one of {', '.join(TEXTS)}: {text!r}")
    rng = np.random.default_rng(seed)
    label = np.sort(rng.integers(0, LABELS, rows))
    vocab = _vocabulary(rng) if text == "words" else None
    names = np.array(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"])
    tmp = path.with_suffix(".tmp")
    writer = None
    try:
        for a in range(0, rows, group_rows):
            lab = label[a: a + group_rows]
            n = len(lab)
            texts = _words(rng, n, *vocab) if vocab is not None else _letters(rng, n)
            tags = pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(lab % 4)]).astype(np.int32),
                                            pa.array(np.ones(int((lab % 4).sum()), np.int32)))
            table = pa.table({"id": np.arange(a, a + n), "label": lab, "text": texts, "score": rng.random(n),
                              "tags": tags, "lang": pa.array(names[lab]).dictionary_encode()})
            table = table.replace_schema_metadata({KIND_KEY: text.encode()})
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table, row_group_size=group_rows)
    finally:
        if writer is not None:
            writer.close()
    os.replace(tmp, path)


def _letters(rng: np.random.Generator, n: int):  # noqa: ANN202 - a pyarrow array
    import pyarrow as pa

    lens = rng.integers(50, 1000, n)
    raw = rng.integers(97, 123, int(lens.sum()), dtype=np.uint8)
    raw[rng.random(len(raw)) < 0.15] = 32
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw)).cast(pa.string())


def _vocabulary(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Words of 1-14 letters (Poisson, mean 5), each with a trailing space: bytes and starts."""
    lengths = np.clip(rng.poisson(5, VOCABULARY), 1, 14) + 1
    starts = np.zeros(VOCABULARY + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    data = rng.integers(97, 123, int(starts[-1]), dtype=np.uint8)
    data[starts[1:] - 1] = 32
    return data, starts


def _words(rng: np.random.Generator, n: int, vocab: np.ndarray, starts: np.ndarray):  # noqa: ANN202
    import pyarrow as pa

    per_row = rng.integers(10, 180, n)
    ids = np.minimum(rng.zipf(1.15, int(per_row.sum())) - 1, VOCABULARY - 1)
    lens = np.diff(starts)[ids]
    at = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(lens, out=at[1:])
    raw = vocab[np.repeat(starts[ids] - at[:-1], lens) + np.arange(int(at[-1]))]
    row_at = np.zeros(n + 1, np.int64)
    np.cumsum(per_row, out=row_at[1:])
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(at[row_at]), pa.py_buffer(raw)).cast(pa.string())
