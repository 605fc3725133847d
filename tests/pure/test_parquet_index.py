"""Level: pure (no mount, no daemon).

The Parquet format as the mount indexes it: a file scanned through its mapping gives an index of
its rows (bounds from the rows' PLAIN bytes, the footer and the per-row sizes), cached by version
and read back whole, refused when it is of another file; and a decoded copy of its rows (row
streams, filled source row group by row group in any order) encodes every view row group to
the very bytes the encoder makes from the decoded source, in any order, with repeated rows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from shufflefs.formats import FramingError, make_format, resolve_format, scan_file  # noqa: E402
from shufflefs.formats.parquet import ParquetIndex, SourceGroups, encode_group, plan_view  # noqa: E402
from shufflefs.formats.parquet.decode import decode_top  # noqa: E402
from shufflefs.formats.parquet.streams import RowStreams, StreamLayout, group_pieces, encode_rows  # noqa: E402
from shufflefs.index.table import IndexCache, cache_key  # noqa: E402

WRITERS = {"pyarrow": pf.write_pyarrow, "variant": pf.write_pyarrow_variant, "pandas": pf.write_pandas,
           "polars": pf.write_polars}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pq")
    return {name: write(d / f"{name}.parquet") for name, write in WRITERS.items()}


def _read(path: Path):
    def read(a: int, b: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(a)
            return f.read(b - a)
    return read


@pytest.mark.parametrize("name", list(WRITERS))
def test_scan_indexes_rows_and_caches_them(files, tmp_path, name):
    path = files[name]
    fmt = resolve_format(path.name, [], {})
    assert fmt.name == "parquet" and fmt.planned_size
    index = scan_file(path, fmt)
    assert isinstance(index, ParquetIndex)
    assert index.n == pq.ParquetFile(path).metadata.num_rows == index.sizes.n_rows
    assert index.stamp.size == path.stat().st_size
    lengths = index.sizes.record_lengths()
    assert (lengths >= 1).all() and np.array_equal(np.diff(index.bounds), lengths)
    fmt.check_index(index, _read(path), str(path))

    cache = IndexCache(tmp_path)
    key = cache_key(path, index.stamp, fmt.name, fmt.params())
    cache.store(key, index)
    back = cache.load(key, index.stamp)
    assert isinstance(back, ParquetIndex) and np.array_equal(back.bounds, index.bounds)
    assert back.footer.digest == index.footer.digest and back.tail == index.tail
    assert all(np.array_equal(a, b) for a, b in zip(back.sizes.to_arrays().values(), index.sizes.to_arrays().values()))


def test_an_index_of_another_file_is_refused(files):
    fmt = make_format("parquet")
    index = scan_file(files["pandas"], fmt)
    with pytest.raises(FramingError, match="another footer"):
        fmt.check_index(index, _read(files["polars"]), str(files["polars"]))


def test_a_cache_entry_whose_bounds_are_not_the_rows_is_not_taken(files, tmp_path):
    fmt = make_format("parquet")
    index = scan_file(files["polars"], fmt)
    bounds = index.bounds.copy()
    bounds[5] += 1
    forged = ParquetIndex(index.footer, index.sizes, index.tail, index.stamp, bounds)
    cache = IndexCache(tmp_path)
    key = cache_key(files["polars"], index.stamp, fmt.name, fmt.params())
    cache.store(key, forged)
    assert cache.load(key, index.stamp) is None


def _copy(path: Path, index: ParquetIndex, groups: list[int]) -> RowStreams:
    lay = StreamLayout(index.footer, index.sizes)
    buf = np.zeros(lay.size, np.uint8)
    pfile = pq.ParquetFile(path)
    for g in groups:
        for top in range(len(index.footer.top)):
            leaves = [leaf for leaf in index.footer.leaves if leaf.top == top]
            for off, arr in group_pieces(lay, g, leaves, decode_top(pfile, index.footer, g, top, str(path)), str(path)):
                buf[off: off + len(arr)] = arr
    return RowStreams(lay, buf, keep_bytes=1 << 16)


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_copy_encodes_the_bytes_the_source_does(files, name):
    path = files[name]
    index = scan_file(path, make_format("parquet"))
    rng = np.random.default_rng(7)
    groups = rng.permutation(len(index.footer.group_rows)).tolist()  # filled in any order
    streams = _copy(path, index, groups)
    order = rng.permutation(index.n)
    order = np.concatenate([order, order[:333]])  # repeats, as --even pad and mixtures make
    view = plan_view(index.footer, index.sizes, order, 1_300, page_bytes=64 << 10)
    source = SourceGroups(str(path), index.footer, str(path), keep=64)
    for g in range(view.n_groups):
        want = encode_group(view, g, source)
        got = encode_rows(view, g, view.rows(g), streams, np.empty(len(want), np.uint8), str(path))
        assert np.array_equal(want, got), g
    source.close()


def test_a_copy_refuses_rows_that_are_not_the_index(files):
    """A decoded row group whose rows' sizes differ from the index (another file, a forged entry)
    is never copied."""
    path = files["pyarrow"]
    index = scan_file(path, make_format("parquet"))
    other = scan_file(files["variant"], make_format("parquet"))
    lay = StreamLayout(index.footer, index.sizes)
    pfile = pq.ParquetFile(files["variant"])
    leaves = [leaf for leaf in other.footer.leaves if leaf.top == 0]
    with pytest.raises(FramingError, match="not the index"):
        group_pieces(lay, 0, leaves, decode_top(pfile, other.footer, 0, 0, "x"), "x")
    assert os.path.exists(path)
