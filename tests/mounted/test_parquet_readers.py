"""Level: mounted (real FUSE mounts, real readers).

Parquet views through a mount: files written by pyarrow (default settings, and INT96 / data page V2
/ zstd), pandas and polars, of several MB and row groups with every column type of
``tests/parquet_files.py``, and a label-sorted file, read at the same path by pyarrow
(``read_table`` with and without memory mapping, ``ParquetFile.iter_batches``, the dataset API),
pandas, polars (read and scan), duckdb, Hugging Face ``datasets`` and a torch DataLoader over
``.parts``.  Each gets the source's schema and key-value metadata and exactly the source's rows,
in an order new each epoch and the same again when an epoch comes back; the label-sorted file's
rows are mixed within twice a uniform shuffle's label mix per 100 rows.  The mount's buffer is
scaled down to the files (2 MiB instead of 64 MiB), so that views hold several windows and row
groups, as a large file's do with the default."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402

WRITERS = {"pyarrow.parquet": pf.write_pyarrow, "variant.parquet": pf.write_pyarrow_variant,
           "pandas.parquet": pf.write_pandas, "polars.parquet": pf.write_polars}
KEYS = {"pyarrow.parquet": ["id"], "variant.parquet": ["id"], "pandas.parquet": ["key"],
        "polars.parquet": ["f32", "ts_ns"], "sorted.parquet": ["id"], "hf.parquet": ["id"]}
"""Columns that tell every row of a file apart: how a view's order is found."""
NAMES = list(WRITERS) + ["sorted.parquet", "hf.parquet"]
ARGS = ("--seed", "3", "--buffer", "2MiB")
MIX_SLACK = 2.0


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pqsrc")
    for name, write in WRITERS.items():
        write(d / name)
    pf.label_sorted(d / "sorted.parquet")
    pytest.importorskip("datasets")
    pf.write_hf(d / "hf.parquet")
    return d


@pytest.fixture(scope="module")
def mnt(module_mount, src):
    return module_mount(None, *ARGS, src=src)


def order_of(view, source, name: str) -> np.ndarray:
    """The source row each view row is (by the file's key columns), every source row once."""
    def keys(t):
        return list(zip(*(t.column(k).to_pylist() for k in KEYS[name])))

    where = {k: i for i, k in enumerate(keys(source))}
    assert len(where) == source.num_rows
    order = np.array([where[k] for k in keys(view)], np.int64)
    assert len(order) == source.num_rows and len(np.unique(order)) == len(order)
    return order


def read_view(mnt, name: str, epoch: int | None = None):
    if epoch is not None:
        mnt.set_epoch(epoch, name)
    return pq.read_table(mnt.path(name))


@pytest.mark.parametrize("name", NAMES)
def test_pyarrow_reads_the_schema_metadata_and_rows(mnt, src, name):
    """Holds: SEMANTICS.md#views-parquet, SEMANTICS.md#views-records"""
    source = pq.read_table(src / name)
    view = read_view(mnt, name)
    assert view.schema.equals(source.schema, check_metadata=True)
    kv = pq.ParquetFile(src / name).metadata.metadata  # ARROW:schema, pandas' metadata, ...
    assert kv and pq.ParquetFile(mnt.path(name)).metadata.metadata == kv
    order = order_of(view, source, name)
    want = pf.plain(source.take(order))
    assert pf.plain(view).equals(want)
    assert not np.array_equal(order, np.arange(len(order)))
    assert pf.plain(pq.read_table(mnt.path(name), memory_map=True)).equals(want)
    batches = list(pq.ParquetFile(mnt.path(name)).iter_batches())
    assert pf.plain(pa.Table.from_batches(batches, schema=view.schema)).equals(want)
    import pyarrow.dataset as ds

    assert pf.plain(ds.dataset(mnt.path(name), format="parquet").to_table()).equals(want)
    md = pq.ParquetFile(mnt.path(name)).metadata
    assert md.num_rows == source.num_rows and md.num_row_groups >= 2
    assert os.stat(mnt.path(name)).st_size == len(mnt.path(name).read_bytes())


@pytest.mark.parametrize("name", NAMES)
def test_pandas_reads_the_same_frame(mnt, src, name):
    """Holds: SEMANTICS.md#views-parquet"""
    pd = pytest.importorskip("pandas")
    cols = [f.name for f in pq.read_schema(src / name)
            if f.type != pa.time64("ns") and not f.name.startswith("__index_level")]
    order = order_of(read_view(mnt, name), pq.read_table(src / name), name)
    view = pd.read_parquet(mnt.path(name), columns=cols)
    want = pd.read_parquet(src / name, columns=cols).iloc[order]
    if name != "pandas.parquet":
        want = want.reset_index(drop=True)
    else:
        assert view.index.name == "key"
    pd.testing.assert_frame_equal(view, want, check_categorical=False)


@pytest.mark.parametrize("name", NAMES)
def test_polars_reads_and_scans_the_same_frame(mnt, src, name):
    """Holds: SEMANTICS.md#views-parquet"""
    pl = pytest.importorskip("polars")
    cols = [f.name for f in pq.read_schema(src / name) if not (pa.types.is_decimal(f.type) and f.type.precision > 38)]
    order = order_of(read_view(mnt, name), pq.read_table(src / name), name)
    want = pl.read_parquet(src / name, columns=cols)[order]
    assert pl.read_parquet(mnt.path(name), columns=cols).equals(want)
    assert pl.scan_parquet(mnt.path(name)).select(cols).collect().equals(want)
    assert pl.read_parquet(mnt.path(name), columns=cols).schema == want.schema


@pytest.mark.parametrize("name", ["pyarrow.parquet", "variant.parquet", "pandas.parquet", "sorted.parquet"])
def test_duckdb_selects_the_same_rows(mnt, src, name):
    """Holds: SEMANTICS.md#views-parquet"""
    duckdb = pytest.importorskip("duckdb")
    source = pq.read_table(src / name)
    order = order_of(read_view(mnt, name), source, name)
    con = duckdb.connect()
    cols = ", ".join(f'"{c}"' for c in KEYS[name] + ["text"])
    got = con.execute(f"SELECT {cols} FROM '{mnt.path(name)}'").fetchall()
    want = con.execute(f"SELECT {cols} FROM '{src / name}'").fetchall()
    assert sorted(got, key=repr) == sorted(want, key=repr)
    key = [tuple(r[: len(KEYS[name])]) for r in got]
    src_keys = list(zip(*(source.column(k).to_pylist() for k in KEYS[name])))
    assert key == [src_keys[i] for i in order]  # the view's order, as pyarrow reads it
    n = con.execute(f"SELECT count(*) FROM '{mnt.path(name)}'").fetchone()[0]
    assert n == source.num_rows


def test_filtered_reads_find_every_matching_row(mnt, src):
    """Readers skip row groups by their statistics (pyarrow's dataset filters, pandas ``filters``,
    polars' and duckdb's pushed-down predicates): a view's row groups hold rows of every part of
    the source, so statistics copied from the source's row groups would drop rows.  The view's
    pages and row groups carry none, and every filter finds the source's rows.
    Holds: SEMANTICS.md#views-parquet"""
    import pandas as pd
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    name = "sorted.parquet"
    view, source = mnt.path(name), src / name
    meta = pq.read_metadata(view)
    assert meta.num_row_groups > 1 and all(meta.row_group(g).column(c).statistics is None
                                           for g in range(meta.num_row_groups) for c in range(meta.num_columns))
    con = duckdb.connect()
    table = pq.read_table(source, columns=["id", "label"])
    ids, labels = table.column("id").to_pylist(), table.column("label").to_pylist()
    for label, lo in ((0, 0), (labels[len(ids) // 3], ids[len(ids) // 3 + 5]), (labels[-1], ids[-1] - 10)):
        want = sorted(i for i, lab in zip(ids, labels) if lab == label and i >= lo)
        assert want
        f = (pc.field("label") == label) & (pc.field("id") >= lo)
        assert sorted(ds.dataset(view).to_table(filter=f).column("id").to_pylist()) == want
        assert sorted(pq.read_table(view, filters=f).column("id").to_pylist()) == want
        assert sorted(pd.read_parquet(view, filters=[("label", "==", label), ("id", ">=", lo)])["id"]) == want
        got = pl.scan_parquet(view).filter((pl.col("label") == label) & (pl.col("id") >= lo)).collect()
        assert sorted(got["id"].to_list()) == want
        rows = con.execute(f"SELECT id FROM '{view}' WHERE label = {label} AND id >= {lo}").fetchall()
        assert sorted(r[0] for r in rows) == want


def test_hugging_face_datasets_loads_the_views(mnt, src, tmp_path):
    """``load_dataset('parquet')`` of a file HF wrote (its ClassLabel and Image features in the
    metadata) and of the label-sorted one: the source's features, the view's rows.  Holds:
    SEMANTICS.md#views-parquet"""
    code = (
        "import sys, json, datasets\n"
        "datasets.disable_progress_bars()\n"
        "out = {}\n"
        "for name in ('hf.parquet', 'sorted.parquet'):\n"
        "    got = [datasets.load_dataset('parquet', data_files=d + '/' + name, split='train', cache_dir=sys.argv[3])\n"
        "           for d in sys.argv[1:3]]\n"
        "    out[name] = [list(got[0]['id']), got[0].features == got[1].features, str(got[0].features)]\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code, str(mnt.path()), str(src), str(tmp_path / "hf")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name, (ids, same_features, features) in got.items():
        view_ids = read_view(mnt, name).column("id").to_pylist()
        assert ids == view_ids and sorted(ids) == list(range(len(ids))) and ids != sorted(ids), name
        assert same_features, features
    assert "ClassLabel" in got["hf.parquet"][2] and "Image" in got["hf.parquet"][2]


def test_every_epoch_has_its_own_order_and_gets_it_again(mnt, src):
    """Holds: SEMANTICS.md#views-parquet, SEMANTICS.md#views-order"""
    name = "sorted.parquet"
    ids = {e: read_view(mnt, name, e).column("id").to_numpy() for e in (0, 1, 2)}
    assert not np.array_equal(ids[0], ids[1]) and not np.array_equal(ids[1], ids[2])
    for e in (1, 0):
        assert np.array_equal(read_view(mnt, name, e).column("id").to_numpy(), ids[e])
    n = pq.ParquetFile(src / name).metadata.num_rows
    assert all(np.array_equal(np.sort(v), np.arange(n)) for v in ids.values())


def test_a_label_sorted_file_is_mixed_as_a_uniform_shuffle(mnt, src):
    """The default strategy shuffles rows, not row groups: every 100 rows of the view carry about
    the labels of the whole file.  Holds: SEMANTICS.md#views-parquet"""
    from shufflefs.quality import expected_label_mix_tv, label_mix_tv

    source = pq.read_table(src / "sorted.parquet")
    assert pq.ParquetFile(src / "sorted.parquet").metadata.num_row_groups >= 6
    labels = read_view(mnt, "sorted.parquet").column("label").to_numpy()
    counts = np.bincount(source.column("label").to_numpy())
    uniform = expected_label_mix_tv(counts, 100)
    mix = label_mix_tv(np.arange(len(labels)), labels, 100)
    in_order = label_mix_tv(np.arange(len(labels)), source.column("label").to_numpy(), 100)
    assert mix < MIX_SLACK * uniform < in_order, (mix, uniform, in_order)


def test_parts_and_a_dataloader_split_the_rows_without_overlap(mnt, src):
    """Holds: SEMANTICS.md#ranks-parts, SEMANTICS.md#views-parquet"""
    torch = pytest.importorskip("torch")
    from shufflefs.torch import part_path

    name = "sorted.parquet"
    whole = read_view(mnt, name, 4).column("id").to_pylist()
    parts = [pq.read_table(mnt.path(f".parts/2/{i}/{name}")) for i in range(2)]
    for part in parts:
        assert part.schema.equals(pq.read_schema(src / name), check_metadata=True)
    ids = [p.column("id").to_pylist() for p in parts]
    assert not set(ids[0]) & set(ids[1]) and sorted(ids[0] + ids[1]) == sorted(whole)

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            with open(part_path(mnt.path(), name), "rb") as f:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=1000, columns=["id"]):
                    yield from batch.column(0).to_pylist()

    loader = torch.utils.data.DataLoader(Rows(), num_workers=2, batch_size=None)
    got = list(loader)
    assert collections.Counter(got) == collections.Counter(whole) and len(got) == len(whole)


def test_the_footer_is_read_without_encoding_the_row_groups(mount, src):
    """A reader reads the footer first: the view's size and footer are there before any row group
    is encoded (where the daemon serves the reads: with passthrough the first open encodes the
    view into its stage).  Holds: SEMANTICS.md#views-parquet-size"""
    mnt = mount(None, *ARGS, "--passthrough", "off", src=src)
    name, epoch = "sorted.parquet", 77
    mnt.set_epoch(epoch, name)
    path = mnt.path(name)
    size = os.stat(path).st_size
    md = pq.ParquetFile(path).metadata  # reads the last bytes only
    assert md.num_rows == pq.ParquetFile(src / name).metadata.num_rows and md.num_row_groups >= 6
    def encoded() -> int:  # view bytes encoded for the epoch so far (windows loaded)
        return mnt.stats()["read_bytes"].get(str(epoch), {}).get("source_bytes", 0)

    # a few windows at most: the first, which an epoch change prepares, and the last row group's
    # pages just before the footer, which a reader's first read of the file's tail asks for
    assert encoded() < size / 3
    assert len(path.read_bytes()) == size
    assert encoded() >= sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))  # all, now


def test_page_indexes_and_bloom_filters_of_the_source_are_not_carried_over(mount, tmp_path):
    """A source's page index (pyarrow ``write_page_index``) and bloom filters (duckdb's writer)
    describe its own pages: the view has neither, and duckdb's and pyarrow's filters, which use
    them when they are there, find the source's rows.  Holds: SEMANTICS.md#views-parquet"""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    duckdb = pytest.importorskip("duckdb")
    n = 50_000
    table = pa.table({"id": np.arange(n), "label": np.repeat(np.arange(10), n // 10),
                      "s": [f"str{i % 977}" for i in range(n)]})
    d = tmp_path / "pi"
    d.mkdir()
    pq.write_table(table, d / "pageindex.parquet", row_group_size=10_000, write_page_index=True, data_page_size=8192)
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM '{d / 'pageindex.parquet'}') TO '{d / 'duck.parquet'}' "
                "(FORMAT parquet, ROW_GROUP_SIZE 10000)")
    assert pq.read_metadata(d / "pageindex.parquet").row_group(0).column(0).has_column_index
    assert any(pq.read_metadata(d / "duck.parquet").row_group(0).column(c).to_dict().get("bloom_filter_offset")
               for c in range(3))
    m = mount(None, src=d)
    for name in ("pageindex.parquet", "duck.parquet"):
        view, source = m.path(name), d / name
        meta = pq.read_metadata(view)
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                col = meta.row_group(g).column(c)
                assert not col.has_column_index and not col.has_offset_index
                assert col.to_dict().get("bloom_filter_offset") in (None, 0, -1)
        for where in ("label = 3", "s = 'str5'", "id BETWEEN 100 AND 200"):
            q = "SELECT count(*), sum(id) FROM '{}' WHERE " + where
            assert con.execute(q.format(view)).fetchall() == con.execute(q.format(source)).fetchall()
        f = pc.field("s") == "str5"
        assert ds.dataset(view).to_table(filter=f).num_rows == ds.dataset(source).to_table(filter=f).num_rows == 52
