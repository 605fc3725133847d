"""Realistic Parquet files for the tests of Parquet views: several row groups and megabytes, every
column type datasets ship (strings, binary blobs like encoded images, lists, structs,
list<struct>, maps, nulls at every nesting level, dictionary-encoded columns, timestamps in
several units with and without a time zone, decimals of several precisions, dates, times,
durations, bools, int8 to uint64, float16/32/64), written by pyarrow (default settings, and a
variant with INT96, data page V2, zstd and integer decimals), by pandas and by polars.

Also `same_rows`, the comparison of a view read by some reader with its source read by the same
reader and taken in the view's order.
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import numpy as np

ROWS = 12_000
GROUP_ROWS = 2_000


def _mask(rng: np.random.Generator, n: int, p: float = 0.1) -> np.ndarray:
    return rng.random(n) < p


def _maybe(rng: np.random.Generator, values: list, p: float = 0.1) -> list:
    return [None if rng.random() < p else v for v in values]


def _words(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[str]:
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz     éü€中"))
    lens = rng.integers(lo, hi, n)
    chars = alphabet[rng.integers(0, len(alphabet), int(lens.sum()))]
    cuts = np.cumsum(lens)[:-1]
    return ["".join(c) for c in np.split(chars, cuts)]


def _blobs(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[bytes]:
    """Bytes like encoded images: a PNG signature and random (incompressible) data."""
    lens = rng.integers(lo, hi, n)
    data = rng.integers(0, 256, int(lens.sum()), dtype=np.uint8).tobytes()
    out, pos = [], 0
    for k in lens.tolist():
        out.append(b"\x89PNG\r\n\x1a\n" + data[pos : pos + k])
        pos += k
    return out


def arrow_table(n: int = ROWS, seed: int = 0):
    """A table of every column type, with nulls at every level where a type allows them."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    ints = {f"i{b}": rng.integers(-(2 ** (b - 1)), 2 ** (b - 1), n, dtype=f"int{b}") for b in (8, 16, 32, 64)}
    uints = {f"u{b}": rng.integers(0, 2**b, n, dtype=f"uint{b}", endpoint=False) for b in (8, 16, 32, 64)}
    cols: dict[str, pa.Array] = {"id": pa.array(np.arange(n, dtype=np.int64))}
    for name, v in {**ints, **uints}.items():
        cols[name] = pa.array(v, mask=_mask(rng, n))
    cols["u64"] = pa.array(np.full(n, 2**64 - 1, np.uint64) - rng.integers(0, 1000, n).astype(np.uint64))
    cols["f16"] = pa.array(rng.standard_normal(n).astype(np.float16), mask=_mask(rng, n))
    cols["f32"] = pa.array(rng.standard_normal(n).astype(np.float32), mask=_mask(rng, n))
    cols["f64"] = pa.array(rng.standard_normal(n))
    cols["flag"] = pa.array(rng.random(n) < 0.3, mask=_mask(rng, n))
    cols["label"] = pa.array(np.sort(rng.integers(0, 10, n)))
    cols["text"] = pa.array(_maybe(rng, _words(rng, n, 0, 300)), pa.string())
    cols["large_text"] = pa.array(_maybe(rng, _words(rng, n, 0, 40)), pa.large_string())
    cols["image"] = pa.array(_maybe(rng, _blobs(rng, n, 100, 800), 0.05), pa.binary())
    paths = _words(rng, n, 5, 20)
    blobs = _blobs(rng, n, 20, 200)
    cols["hf_image"] = pa.array(_maybe(rng, [{"bytes": b, "path": p} for b, p in zip(blobs, paths)], 0.05),
                                pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    words = _words(rng, 50, 2, 8)
    tags = [None if rng.random() < 0.1 else _maybe(rng, [words[i] for i in rng.integers(0, 50, rng.integers(0, 5))])
            for _ in range(n)]
    cols["tags"] = pa.array(tags, pa.list_(pa.string()))
    cols["vec"] = pa.array([None if rng.random() < 0.05 else rng.standard_normal(8).astype(np.float32).tolist()
                            for _ in range(n)], pa.list_(pa.float32(), 8))
    cols["big_list"] = pa.array([None if rng.random() < 0.1 else rng.integers(-5, 5, rng.integers(0, 4)).tolist()
                                 for _ in range(n)], pa.large_list(pa.int64()))

    def inner():
        if rng.random() < 0.1:
            return None
        return {"a": None if rng.random() < 0.2 else int(rng.integers(-100, 100)),
                "b": None if rng.random() < 0.2 else _maybe(rng, _words(rng, int(rng.integers(0, 3)), 0, 6), 0.2)}

    cols["turns"] = pa.array([None if rng.random() < 0.1 else [inner() for _ in range(rng.integers(0, 4))]
                              for _ in range(n)],
                             pa.list_(pa.struct([("a", pa.int32()), ("b", pa.list_(pa.string()))])))
    cols["point"] = pa.array([None if rng.random() < 0.1 else {
        "x": float(rng.standard_normal()),
        "y": None if rng.random() < 0.2 else {"z": None if rng.random() < 0.2 else int(rng.integers(-9, 9)),
                                               "w": words[int(rng.integers(0, 50))]}} for _ in range(n)],
        pa.struct([("x", pa.float64()), ("y", pa.struct([("z", pa.int16()), ("w", pa.string())]))]))
    cols["attrs"] = pa.array([None if rng.random() < 0.1 else [
        (words[int(k)], None if rng.random() < 0.2 else int(rng.integers(0, 1000))) for k in rng.integers(0, 50, rng.integers(0, 4))]
        for _ in range(n)], pa.map_(pa.string(), pa.int64()))
    cols["lang"] = pa.array(_maybe(rng, [words[i] for i in rng.integers(0, 6, n)])).dictionary_encode()
    cols["kinds"] = pa.array([None if rng.random() < 0.1 else [words[i] for i in rng.integers(0, 4, rng.integers(0, 3))]
                              for _ in range(n)], pa.list_(pa.string())).cast(pa.list_(pa.dictionary(pa.int32(), pa.string())))
    base = np.int64(1_600_000_000)
    secs = base + rng.integers(-10**8, 10**8, n)
    cols["ts_s"] = pa.array(secs, pa.timestamp("s"), mask=_mask(rng, n))
    cols["ts_ms"] = pa.array(secs * 1000 + rng.integers(0, 1000, n), pa.timestamp("ms"), mask=_mask(rng, n))
    cols["ts_us"] = pa.array(secs * 10**6 + rng.integers(0, 10**6, n), pa.timestamp("us", tz="UTC"))
    cols["ts_ns"] = pa.array(secs * 10**9 + rng.integers(0, 10**9, n), pa.timestamp("ns", tz="Europe/Paris"),
                             mask=_mask(rng, n))
    cols["day"] = pa.array(rng.integers(-20000, 30000, n).astype(np.int32), pa.date32(), mask=_mask(rng, n))
    cols["day64"] = pa.array(rng.integers(-20000, 30000, n).astype(np.int64) * 86_400_000, pa.date64())
    cols["t_ms"] = pa.array(rng.integers(0, 86_400_000, n).astype(np.int32), pa.time32("ms"))
    cols["t_us"] = pa.array(rng.integers(0, 86_400 * 10**6, n), pa.time64("us"), mask=_mask(rng, n))
    cols["t_ns"] = pa.array(rng.integers(0, 86_400 * 10**9, n), pa.time64("ns"))
    cols["wait"] = pa.array(rng.integers(-10**9, 10**9, n), pa.duration("ms"), mask=_mask(rng, n))
    for name, (p, s) in {"price": (5, 2), "amount": (18, 4), "wide": (38, 10)}.items():
        digits = rng.integers(-(10 ** min(p, 18) - 1), 10 ** min(p, 18), n)
        cols[name] = pa.array(_maybe(rng, [decimal.Decimal(int(d)).scaleb(-s) for d in digits]), pa.decimal128(p, s))
    cols["huge"] = pa.array(_maybe(rng, [decimal.Decimal(int(d) * 10**40 + 7).scaleb(-20)
                                         for d in rng.integers(-10**15, 10**15, n)]), pa.decimal256(76, 20))
    cols["uuid"] = pa.array(_maybe(rng, [bytes(rng.integers(0, 256, 16, dtype=np.uint8)) for _ in range(n)]),
                            pa.binary(16))
    cols["nothing"] = pa.nulls(n)
    return pa.table(cols)


def write_pyarrow(path: Path, table=None) -> Path:
    """pyarrow with default settings (snappy, dictionaries, statistics, data page V1)."""
    import pyarrow.parquet as pq

    pq.write_table(arrow_table() if table is None else table, path, row_group_size=GROUP_ROWS)
    return path


def write_pyarrow_variant(path: Path) -> Path:
    """The other way pyarrow writes: INT96 timestamps, data page V2, zstd, no dictionaries or
    statistics, decimals as INT32/INT64, an older format version."""
    import pyarrow.parquet as pq

    t = arrow_table(6_000, seed=1).drop_columns(["ts_s"])
    pq.write_table(t, path, row_group_size=1_500, use_deprecated_int96_timestamps=True, data_page_version="2.0",
                   compression="zstd", use_dictionary=False, write_statistics=False, store_decimal_as_integer=True,
                   version="2.4")
    return path


def pandas_frame(n: int = 8_000, seed: int = 2):
    import pandas as pd

    rng = np.random.default_rng(seed)
    words = _words(rng, 40, 3, 10)
    frame = pd.DataFrame({
        "n": rng.integers(-10**12, 10**12, n),
        "maybe": pd.array(np.where(_mask(rng, n), None, rng.integers(0, 100, n)), dtype="Int32"),
        "x": rng.standard_normal(n),
        "ok": rng.random(n) < 0.5,
        "okish": pd.array(np.where(_mask(rng, n), None, rng.random(n) < 0.5), dtype="boolean"),
        "text": _maybe(rng, _words(rng, n, 0, 200)),
        "cat": pd.Categorical([words[i] for i in rng.integers(0, 7, n)]),
        "when": pd.to_datetime(rng.integers(10**9, 2 * 10**9, n), unit="s"),
        "when_utc": pd.to_datetime(rng.integers(10**18, 2 * 10**18, n), unit="ns", utc=True),
        "when_ny": pd.to_datetime(rng.integers(10**15, 2 * 10**15, n), unit="us").tz_localize("America/New_York",
                                                                                              ambiguous="NaT",
                                                                                              nonexistent="NaT"),
        "took": pd.to_timedelta(rng.integers(0, 10**12, n), unit="ns"),
        "blob": _maybe(rng, _blobs(rng, n, 50, 600)),
        "nums": [None if rng.random() < 0.1 else rng.integers(0, 9, rng.integers(0, 4)).tolist() for _ in range(n)],
        "rec": [None if rng.random() < 0.1 else {"k": words[int(rng.integers(0, 40))], "v": float(rng.random())}
                for _ in range(n)],
        "money": _maybe(rng, [decimal.Decimal(int(d)).scaleb(-2) for d in rng.integers(-10**9, 10**9, n)]),
        "born": _maybe(rng, [dt.date(1950, 1, 1) + dt.timedelta(days=int(d)) for d in rng.integers(0, 25000, n)]),
    }, index=pd.Index([f"r{i}" for i in rng.permutation(n)], name="key"))
    return frame


def write_pandas(path: Path) -> Path:
    """pandas (through pyarrow), with a string index stored as a column."""
    pandas_frame().to_parquet(path, row_group_size=1_500)
    return path


def polars_frame(n: int = 8_000, seed: int = 3):
    import polars as pl

    rng = np.random.default_rng(seed)
    words = _words(rng, 30, 3, 10)

    def nulls(values: list, p: float = 0.1) -> list:
        return _maybe(rng, values, p)

    cols = {f"i{b}": pl.Series(nulls(rng.integers(-(2 ** (b - 1)), 2 ** (b - 1), n).tolist()), dtype=getattr(pl, f"Int{b}"))
            for b in (8, 16, 32, 64)}
    cols.update({f"u{b}": pl.Series(nulls(rng.integers(0, 2 ** min(b, 63), n).tolist()), dtype=getattr(pl, f"UInt{b}"))
                 for b in (8, 16, 32, 64)})
    cols.update({
        "f32": pl.Series(rng.standard_normal(n).astype(np.float32)),
        "f64": pl.Series(nulls(rng.standard_normal(n).tolist())),
        "flag": pl.Series(nulls((rng.random(n) < 0.5).tolist()), dtype=pl.Boolean),
        "text": pl.Series(nulls(_words(rng, n, 0, 300)), dtype=pl.Utf8),
        "blob": pl.Series(nulls(_blobs(rng, n, 50, 800)), dtype=pl.Binary),
        "cat": pl.Series(nulls([words[i] for i in rng.integers(0, 8, n)]), dtype=pl.Categorical),
        "day": pl.Series(nulls([dt.date(2000, 1, 1) + dt.timedelta(days=int(d)) for d in rng.integers(-9000, 9000, n)]),
                         dtype=pl.Date),
        "ts_ms": pl.Series(rng.integers(10**12, 2 * 10**12, n)).cast(pl.Datetime("ms")),
        "ts_us_utc": pl.Series(nulls(rng.integers(10**15, 2 * 10**15, n).tolist())).cast(pl.Datetime("us", "UTC")),
        "ts_ns": pl.Series(rng.integers(10**18, 2 * 10**18, n)).cast(pl.Datetime("ns")),
        "t": pl.Series(rng.integers(0, 86_400 * 10**9, n)).cast(pl.Time),
        "wait": pl.Series(nulls(rng.integers(-10**12, 10**12, n).tolist())).cast(pl.Duration("us")),
        "money": pl.Series(nulls([decimal.Decimal(int(d)).scaleb(-2) for d in rng.integers(-10**9, 10**9, n)]),
                           dtype=pl.Decimal(12, 2)),
        "nums": pl.Series([None if rng.random() < 0.1 else nulls(rng.integers(0, 9, rng.integers(0, 4)).tolist())
                           for _ in range(n)], dtype=pl.List(pl.Int64)),
        "words": pl.Series([None if rng.random() < 0.1 else [words[i] for i in rng.integers(0, 30, rng.integers(0, 3))]
                            for _ in range(n)], dtype=pl.List(pl.Utf8)),
        "emb": pl.Series([rng.standard_normal(4).astype(np.float32).tolist() for _ in range(n)],
                         dtype=pl.Array(pl.Float32, 4)),
        "rec": pl.Series([None if rng.random() < 0.1 else {"k": words[int(rng.integers(0, 30))],
                                                           "v": None if rng.random() < 0.2 else int(rng.integers(0, 99))}
                          for _ in range(n)], dtype=pl.Struct({"k": pl.Utf8, "v": pl.Int32})),
    })
    return pl.DataFrame(cols)


def write_polars(path: Path) -> Path:
    """polars' own writer (zstd, statistics, its own page sizes)."""
    polars_frame().write_parquet(path, row_group_size=1_500)
    return path


def plain(table):
    """``table`` with dictionary columns as their values: two readings of the same rows may pick
    different dictionaries (a view's are built anew), which `Table.equals` would count."""
    import pyarrow as pa

    def undict(t: pa.DataType) -> pa.DataType:
        if pa.types.is_dictionary(t):
            return undict(t.value_type)
        if pa.types.is_list(t):
            return pa.list_(t.value_field.with_type(undict(t.value_type)))
        if pa.types.is_large_list(t):
            return pa.large_list(t.value_field.with_type(undict(t.value_type)))
        return t

    for i, f in enumerate(table.schema):
        if undict(f.type) != f.type:
            table = table.set_column(i, f.with_type(undict(f.type)), table.column(i).cast(undict(f.type)))
    return table


def label_sorted(path: Path, n: int = 60_000, group_rows: int = 10_000, labels: int = 10, seed: int = 4) -> Path:
    """A file whose rows are sorted by ``label`` (``labels`` equally common values), as datasets
    exported class by class are: id, label, a 50-1000 character text, a score, a list<int32> and
    a dictionary-encoded string, in row groups of ``group_rows`` (about 35 MB for 60,000 rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    label = np.repeat(np.arange(labels), -(-n // labels))[:n]
    lens = rng.integers(50, 1000, n)
    raw = rng.integers(97, 123, int(lens.sum()), dtype=np.uint8)
    raw[rng.random(len(raw)) < 0.15] = 32
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lens, out=offsets[1:])
    text = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw))
    words = np.array(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"])
    tags_offsets = np.concatenate([[0], np.cumsum(label % 4)]).astype(np.int32)
    table = pa.table({"id": np.arange(n), "label": label, "text": text, "score": rng.random(n),
                      "tags": pa.ListArray.from_arrays(tags_offsets, pa.array(np.ones(int(tags_offsets[-1]), np.int32))),
                      "lang": pa.array(words[label % len(words)]).dictionary_encode()})
    pq.write_table(table, path, row_group_size=group_rows)
    return path


TWO_FILES = ("types.parquet", "sorted.parquet")


def two_files(d: Path) -> Path:
    """``d`` made, holding `TWO_FILES`: every column type, and 20,000 label-sorted rows (what the
    tests of copies and stages kept for later mounts mount)."""
    d.mkdir()
    write_pyarrow(d / TWO_FILES[0])
    label_sorted(d / TWO_FILES[1], n=20_000, group_rows=4_000)
    return d


def read_as_served(later, served, epochs: tuple[int, ...], epoch0: dict[str, bytes],
                   names: tuple[str, ...] = TWO_FILES) -> None:
    """Every view of the mount ``later`` in each of ``epochs`` holds the bytes the mount ``served``
    (the daemon serving from its own copy) gives, and in epoch 0 those of ``epoch0``."""
    for epoch in epochs:
        for m in (later, served):
            m.set_epoch(epoch)
        for name in names:
            got = later.path(name).read_bytes()
            assert got == served.path(name).read_bytes()
            assert epoch or got == epoch0[name]


def write_hf(path: Path, n: int = 4_000) -> Path:
    """A file written by HF ``datasets`` itself, as the Hub's Parquet exports are: its features
    (a ClassLabel, an Image) in the key-value metadata, every column type it has a feature for
    (no maps), row groups of 700 rows."""
    import datasets

    ds = datasets.Dataset(arrow_table(n, seed=4).drop_columns(["attrs"]))
    ds = ds.cast_column("label", datasets.ClassLabel(num_classes=10)).cast_column("hf_image", datasets.Image())
    ds.to_parquet(str(path), batch_size=700)
    return path


def drop_from_page_cache(path: Path) -> None:
    """``path``'s pages written back and dropped from the page cache: read from the disk next, as
    after a reboot (a file a process maps keeps its mapped pages)."""
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
