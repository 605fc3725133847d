"""Level: pure (no mount, no daemon).

Parquet views encoded to files and read by every reader users run: realistic sources (several
row groups, megabytes, every column type; written by pyarrow, pandas and polars) shown in a random
row order, and with rows repeated, read back by pyarrow (read_table with and without memory
mapping, iter_batches, the dataset API), pandas, polars (read and scan), duckdb and HF datasets:
the same schema with its key-value metadata and exactly the source's rows in the view's order.
Every page, chunk and row group lies where the layout says and is as large as it says."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from shufflefs.formats.parquet import (SourceGroups, encode_group, footer_of_file, plan_view,  # noqa: E402
                                       sizes_of_file, view_bytes, write_view)
from shufflefs.formats.parquet.thrift import read_struct  # noqa: E402

WRITERS = {"pyarrow": pf.write_pyarrow, "pyarrow-int96-v2-zstd": pf.write_pyarrow_variant,
           "pandas": pf.write_pandas, "polars": pf.write_polars}


class Case:
    """A source, its index and a view of it in a random order, written to a file."""

    def __init__(self, src: Path, view: Path, order: np.ndarray, rows_per_group: int, page_bytes: int) -> None:
        self.src, self.view, self.order = src, view, order
        self.footer, self.sizes = sizes_of_file(str(src))
        self.layout = plan_view(self.footer, self.sizes, order, rows_per_group, page_bytes=page_bytes)
        groups = SourceGroups(str(src), self.footer, str(src), keep=64)
        with open(view, "wb") as f:
            write_view(self.layout, groups, f)
        groups.close()


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    d = tmp_path_factory.mktemp("parquet")
    out = {}
    for k, (name, write) in enumerate(WRITERS.items()):
        src = write(d / f"{name}.parquet")
        n = pq.ParquetFile(src).metadata.num_rows
        order = np.random.default_rng(k).permutation(n)
        # row groups that do not line up with the source's; small pages in one case, so that
        # chunks hold many pages
        out[name] = Case(src, d / f"{name}.view.parquet", order, 1_700, 64 << 10 if k == 0 else 1 << 20)
    return out


def test_sources_are_realistic(cases):
    for case in cases.values():
        md = pq.ParquetFile(case.src).metadata
        assert md.num_row_groups >= 4 and case.src.stat().st_size > 3 << 20
    lay = cases["pyarrow"].layout
    assert max(int(cp.first[-1]) for cp in lay.columns) > 5 * lay.n_groups  # chunks of several pages


def _expected(case: Case):
    return pf.plain(pq.read_table(case.src).take(case.order))


@pytest.mark.parametrize("name", list(WRITERS))
def test_pyarrow_reads_the_same_schema_and_rows(cases, name):
    case = cases[name]
    src_schema = pq.read_schema(case.src)
    for kwargs in ({}, {"memory_map": True}):
        view = pq.read_table(case.view, **kwargs)
        assert view.schema.equals(src_schema, check_metadata=True)
        assert pf.plain(view).equals(_expected(case))
    batches = list(pq.ParquetFile(case.view).iter_batches(batch_size=777))
    assert pf.plain(pa.Table.from_batches(batches)).equals(_expected(case))
    import pyarrow.dataset as ds

    assert pf.plain(ds.dataset(case.view).to_table()).equals(_expected(case))
    assert pq.ParquetFile(case.view).metadata.num_rows == len(case.order)


def _pandas_columns(path: Path) -> list[str]:
    """The columns pandas can convert at all (not time64[ns], which it refuses in the source too)."""
    schema = pq.read_schema(path)
    return [f.name for f in schema if f.type != pa.time64("ns") and not f.name.startswith("__index_level")]


@pytest.mark.parametrize("name", list(WRITERS))
def test_pandas_reads_the_same_frame(cases, name):
    pd = pytest.importorskip("pandas")
    case = cases[name]
    cols = _pandas_columns(case.src)
    view = pd.read_parquet(case.view, columns=cols)
    want = pd.read_parquet(case.src, columns=cols).iloc[case.order]
    if name != "pandas":  # a RangeIndex is not stored; the pandas source's string index is
        want = want.reset_index(drop=True)
    else:
        assert view.index.name == "key"
    # the categories are the same set; their order is the view's first appearance (values are
    # PLAIN, not dictionary pages), as the docstring of shufflefs.formats.parquet says
    pd.testing.assert_frame_equal(view, want, check_categorical=False)


@pytest.mark.parametrize("name", list(WRITERS))
def test_polars_reads_and_scans_the_same_frame(cases, name):
    pl = pytest.importorskip("polars")
    case = cases[name]
    # decimal256 (76 digits) is past what polars reads, in the source as in the view
    cols = [f.name for f in pq.read_schema(case.src) if not (pa.types.is_decimal(f.type) and f.type.precision > 38)]
    want = pl.read_parquet(case.src, columns=cols)[case.order]
    assert pl.read_parquet(case.view, columns=cols).equals(want)
    assert pl.scan_parquet(case.view).select(cols).collect().equals(want)
    assert pl.read_parquet(case.view, columns=cols).schema == pl.read_parquet(case.src, columns=cols).schema


@pytest.mark.parametrize("name", list(WRITERS))
def test_duckdb_reads_the_same_rows(cases, name):
    duckdb = pytest.importorskip("duckdb")
    case = cases[name]
    con = duckdb.connect()
    view = con.sql(f"SELECT * FROM '{case.view}'").to_arrow_table()
    src = con.sql(f"SELECT * FROM '{case.src}'").to_arrow_table()
    assert view.schema.equals(src.schema)
    assert pf.plain(view).equals(pf.plain(src.take(case.order)))
    n = con.execute(f"SELECT count(*) FROM '{case.view}'").fetchone()[0]
    assert n == len(case.order)


@pytest.fixture(scope="module")
def hf_case(tmp_path_factory) -> Case:
    """A file written by HF datasets itself: its features (ClassLabel, Image) in the key-value
    metadata, every column type it has a feature for (no maps)."""
    datasets = pytest.importorskip("datasets")
    d = tmp_path_factory.mktemp("hf")
    ds = datasets.Dataset(pf.arrow_table(4_000, seed=4).drop_columns(["attrs"]))
    ds = ds.cast_column("label", datasets.ClassLabel(num_classes=10)).cast_column("hf_image", datasets.Image())
    ds.to_parquet(str(d / "train.parquet"), batch_size=700)
    return Case(d / "train.parquet", d / "view.parquet", np.random.default_rng(9).permutation(4_000), 1_000, 1 << 20)


def _hf_same(src: Path, view: Path, order: np.ndarray) -> None:
    datasets = pytest.importorskip("datasets")
    with tempfile.TemporaryDirectory() as cache:
        got = datasets.load_dataset("parquet", data_files=str(view), split="train", cache_dir=cache)
        want = datasets.load_dataset("parquet", data_files=str(src), split="train", cache_dir=cache)
        assert got.features == want.features
        assert pf.plain(got.data.table).equals(pf.plain(want.data.table.take(order)))


def test_hf_datasets_loads_the_same_rows_and_features(hf_case):
    assert pq.ParquetFile(hf_case.src).metadata.num_row_groups >= 4
    _hf_same(hf_case.src, hf_case.view, hf_case.order)


@pytest.mark.parametrize("name", ["pandas", "polars"])
def test_hf_datasets_loads_other_writers_files(cases, name):
    """(HF datasets has no feature for maps, so it reads neither the pyarrow sources nor views.)"""
    _hf_same(cases[name].src, cases[name].view, cases[name].order)


def _pages(data: bytes, offset: int, size: int) -> list[tuple[int, int, int]]:
    """(header bytes, body bytes, values) of every page of the chunk at ``offset``, read with the
    thrift reader from the encoded bytes."""
    out, pos = [], offset
    while pos < offset + size:
        h, end = read_struct(data, pos)
        out.append((end - pos, h.fields[3], h.fields[5].fields[1]))
        assert h.fields[2] == h.fields[3] and h.fields[1] == 0
        pos = end + h.fields[3]
    assert pos == offset + size
    return out


@pytest.mark.parametrize("name", list(WRITERS))
def test_every_planned_size_is_the_encoded_size(cases, name):
    case = cases[name]
    lay = case.layout
    data = case.view.read_bytes()
    assert len(data) == lay.size and data[:4] == data[-4:] == b"PAR1"
    assert data[lay.tail_start : lay.size] == lay.tail
    md = pq.ParquetFile(case.view).metadata
    assert md.num_row_groups == lay.n_groups
    for g in range(lay.n_groups):
        start, end = lay.group_range(g)
        rg = md.row_group(g)
        assert rg.num_rows == len(lay.rows(g))
        assert len(encode_group(lay, g, SourceGroups(str(case.src), case.footer, "x"))) == end - start
        for c, cp in enumerate(lay.columns):
            col = rg.column(c)
            assert col.data_page_offset == lay.chunk_offset[g, c]
            assert col.total_compressed_size == col.total_uncompressed_size == lay.chunk_size[g, c]
            assert col.num_values == lay.chunk_values[g, c]
            got = _pages(data, int(lay.chunk_offset[g, c]), int(lay.chunk_size[g, c]))
            p = slice(int(cp.first[g]), int(cp.first[g + 1]))
            assert [x[0] for x in got] == cp.header[p].tolist()
            assert [x[1] for x in got] == cp.body[p].tolist()
            assert [x[2] for x in got] == cp.entries[p].tolist()
            assert np.array_equal(cp.offset[p][1:], cp.offset[p][:-1] + cp.header[p][:-1] + cp.body[p][:-1])
        assert lay.group_at(start) == g and lay.group_at(end - 1) == g


def test_repeated_rows_are_shown_as_often_as_the_order_says(tmp_path):
    """A mixture's order may take a row twice (or more): the view holds it that often."""
    pd = pytest.importorskip("pandas")
    src = tmp_path / "s.parquet"
    frame = pf.pandas_frame(3_000).reset_index(drop=True)
    frame.to_parquet(src, row_group_size=700)  # a RangeIndex in the pandas metadata
    footer, sizes = sizes_of_file(str(src))
    rng = np.random.default_rng(5)
    order = np.concatenate([np.arange(3_000), np.arange(3_000), rng.integers(0, 3_000, 500)])
    rng.shuffle(order)
    layout = plan_view(footer, sizes, order, [1_000, 4_000, 1_500])
    data = view_bytes(layout, SourceGroups(str(src), footer, str(src), keep=8))
    view = pq.read_table(io.BytesIO(data))
    assert view.num_rows == 6_500
    assert pf.plain(view).equals(pf.plain(pq.read_table(src).take(order)))
    got = pd.read_parquet(io.BytesIO(data))
    cols = [c for c in frame.columns]
    pd.testing.assert_frame_equal(got[cols], frame.iloc[order].reset_index(drop=True), check_categorical=False)
    assert [pq.ParquetFile(io.BytesIO(data)).metadata.row_group(g).num_rows for g in range(3)] == [1_000, 4_000, 1_500]


def test_an_empty_order_is_an_empty_parquet_file_of_the_schema(cases):
    case = cases["pyarrow"]
    layout = plan_view(case.footer, case.sizes, np.zeros(0, np.int64), 100)
    data = view_bytes(layout, SourceGroups(str(case.src), case.footer, "x"))
    t = pq.read_table(io.BytesIO(data))
    assert t.num_rows == 0 and t.schema.equals(pq.read_schema(case.src), check_metadata=True)
    assert len(data) == layout.size


def test_the_index_is_compact_and_round_trips(cases):
    from shufflefs.formats.parquet import RowSizes

    s = cases["pyarrow"].sizes
    back = RowSizes.from_arrays({k: np.array(v) for k, v in s.to_arrays().items()})
    assert back.digest == s.digest and np.array_equal(back.group_starts, s.group_starts)
    for a, b in zip(back.columns, s.columns):
        for x, y in ((a.values, b.values), (a.entries, b.entries)):
            assert (x == y) if not isinstance(x, np.ndarray) else np.array_equal(x, y) and x.dtype == y.dtype
    # id, i64 and f64 are fixed-width without nulls: no bytes per row at all
    names = [leaf.dotted for leaf in cases["pyarrow"].footer.leaves]
    assert isinstance(s.columns[names.index("id")].values, int)
    assert s.columns[names.index("i8")].values.dtype == np.uint8  # 4 or 0 (null)
    assert np.array_equal(s.group_of(np.array([0, 1_999, 2_000, 11_999])), [0, 0, 1, 5])
    lengths = s.record_lengths()
    assert len(lengths) == s.n_rows and lengths.min() >= 1
    assert footer_of_file(str(cases["pyarrow"].src)).digest == s.digest


def test_the_numpy_fallback_encodes_the_same_bytes(cases, monkeypatch):
    from shufflefs.formats.parquet import encode

    case = cases["pandas"]
    groups = SourceGroups(str(case.src), case.footer, "x", keep=64)
    compiled = encode_group(case.layout, 1, groups).tobytes()
    monkeypatch.setattr(encode, "_gather", None)
    assert encode_group(case.layout, 1, groups).tobytes() == compiled
