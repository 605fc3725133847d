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
from shufflefs.formats.parquet.decode import decode_top, decode_top_batches  # noqa: E402
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
    return RowStreams(lay, buf)


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


@pytest.fixture(scope="module")
def fixed_widths(tmp_path_factory) -> Path:
    """Required and nullable fixed-width leaves of 4, 8, 12 (INT96), 16 and 32 bytes, with and
    without nulls, in row groups that do not divide the rows evenly."""
    import decimal

    n = 5_003
    rng = np.random.default_rng(11)
    ints = rng.integers(-2**31, 2**31, n).astype(np.int32)
    table = pa.table({
        "req_i32": pa.array(ints, pa.int32()),
        "uuid": pa.array([bytes(rng.integers(0, 256, 16, dtype=np.uint8)) for _ in range(n)], pa.binary(16)),
        "dec": pa.array([decimal.Decimal(int(x)) / 100 for x in ints], pa.decimal128(38, 2)),
        "hash": pa.array([bytes(rng.integers(0, 256, 32, dtype=np.uint8)) for _ in range(n)], pa.binary(32)),
        "maybe": pa.array([None if i % 7 == 0 else float(i) for i in range(n)], pa.float64()),
        "ts96": pa.array(np.arange(n, dtype=np.int64).astype("datetime64[ns]")),
    }, schema=pa.schema([pa.field("req_i32", pa.int32(), nullable=False), pa.field("uuid", pa.binary(16)),
                         pa.field("dec", pa.decimal128(38, 2)), pa.field("hash", pa.binary(32), nullable=False),
                         pa.field("maybe", pa.float64()), pa.field("ts96", pa.timestamp("ns"))]))
    path = tmp_path_factory.mktemp("fixed") / "fixed.parquet"
    pq.write_table(table, path, row_group_size=1_234, use_deprecated_int96_timestamps=True)
    return path


def test_fixed_width_columns_encode_as_every_column_does(files, fixed_widths, monkeypatch):
    """Leaves whose rows are all alike (fixed width, no nulls) are encoded by indexing the copy's
    streams (`uniform_width`); the bytes are those the run-by-run way gives."""
    from shufflefs.formats.parquet import streams as st

    seen = 0
    widths = set()
    for path in [*files.values(), fixed_widths]:
        index = scan_file(path, make_format("parquet"))
        got = [st.uniform_width(leaf, col, b) for leaf, col, b in
               zip(index.footer.leaves, index.sizes.columns, index.sizes.booleans)]
        seen += sum(map(bool, got))
        widths |= set(got)
        copy = _copy(path, index, list(range(len(index.footer.group_rows))))
        order = np.random.default_rng(3).permutation(index.n)
        view = plan_view(index.footer, index.sizes, order, 900, page_bytes=16 << 10)
        fast = [encode_rows(view, g, view.rows(g), copy, np.empty(view.group_range(g)[1] - view.group_range(g)[0],
                                                                   np.uint8), str(path)).copy() for g in range(view.n_groups)]
        with monkeypatch.context() as m:
            m.setattr(st, "uniform_width", lambda leaf, col, boolean: 0)
            for g in range(view.n_groups):
                want = encode_rows(view, g, view.rows(g), copy, np.empty(len(fast[g]), np.uint8), str(path))
                assert np.array_equal(fast[g], want), (path.name, g)
        if path == fixed_widths:  # and the view reads back as the source's rows, in the view's order
            groups = SourceGroups(str(path), index.footer, str(path), keep=64)
            for g in range(view.n_groups):
                assert np.array_equal(fast[g], encode_group(view, g, groups)), g
            groups.close()
    assert seen >= 4 and {4, 8, 12, 16, 32} <= widths, (seen, widths)


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_copy_made_in_batches_is_the_copy_made_whole(files, name):
    """Decoding a column chunk in batches of rows (what a mount does, to hold one batch decoded)
    writes every byte of the copy that decoding it whole does, whatever the batch size."""
    path = files[name]
    index = scan_file(path, make_format("parquet"))
    whole = _copy(path, index, list(range(len(index.footer.group_rows)))).data
    lay = StreamLayout(index.footer, index.sizes)
    pfile = pq.ParquetFile(path)
    for batch in (333, 1000, 1 << 20):
        buf = np.zeros(lay.size, np.uint8)
        for g in range(len(index.footer.group_rows)):
            for top in range(len(index.footer.top)):
                leaves = [leaf for leaf in index.footer.leaves if leaf.top == top]
                for first, datas in decode_top_batches(pfile, index.footer, g, top, str(path), batch):
                    assert first == 0 or batch < 1 << 20
                    for off, arr in group_pieces(lay, g, leaves, datas, str(path), first):
                        buf[off: off + len(arr)] = arr
        assert np.array_equal(buf, whole), batch


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


def test_any_run_of_pages_encodes_to_its_slice_of_the_chunk(files):
    """A window's pages are encoded alone: the same bytes as where they lie in their chunk."""
    from shufflefs.formats.parquet.streams import encode_pages

    path = files["pyarrow"]
    index = scan_file(path, make_format("parquet"))
    streams = _copy(path, index, list(range(len(index.footer.group_rows))))
    rng = np.random.default_rng(3)
    view = plan_view(index.footer, index.sizes, rng.permutation(index.n), 2_500, page_bytes=16 << 10)
    for _ in range(60):
        g = int(rng.integers(view.n_groups))
        c = int(rng.integers(len(index.footer.leaves)))
        cp = view.columns[c]
        a, b = int(cp.first[g]), int(cp.first[g + 1])
        whole = encode_pages(view, g, c, view.rows(g), streams, np.empty(int(view.chunk_size[g, c]), np.uint8))
        p0 = int(rng.integers(a, b))
        p1 = int(rng.integers(p0 + 1, b + 1))
        part = encode_pages(view, g, c, view.rows(g), streams, np.empty(len(whole), np.uint8), range(p0, p1))
        lo = int(cp.offset[p0] - view.chunk_offset[g, c])
        assert np.array_equal(part, whole[lo: lo + len(part)]), (g, c, p0, p1)


def test_page_windows_tile_every_row_group(files):
    from shufflefs.stages.parquet_view import page_windows

    index = scan_file(files["pandas"], make_format("parquet"))
    view = plan_view(index.footer, index.sizes, np.random.default_rng(4).permutation(index.n), 3_000,
                     page_bytes=8 << 10)
    group, window_runs, col, first, end = page_windows(view, 64 << 10)
    assert len(group) > 2 * view.n_groups and np.all(np.diff(group) >= 0)
    seen = np.zeros(sum(len(cp.total) for cp in view.columns), bool)
    base = np.cumsum([0] + [len(cp.total) for cp in view.columns])
    pos = 4
    for w in range(len(group)):
        for r in range(int(window_runs[w]), int(window_runs[w + 1])):
            cp = view.columns[int(col[r])]
            assert int(cp.offset[first[r]]) == pos  # runs follow each other, byte for byte
            pos = int(cp.offset[end[r] - 1] + cp.total[end[r] - 1])
            pages = np.arange(first[r], end[r])
            assert (np.repeat(np.arange(view.n_groups), np.diff(cp.first))[pages] == group[w]).all()
            seen[base[int(col[r])] + pages] = True
    assert pos == view.tail_start and seen.all()


@pytest.mark.parametrize("name", list(WRITERS))
def test_pages_encode_the_same_bytes_without_the_compiled_module(files, name, monkeypatch):
    """The compiled page gather (`_rows.c`: runs of rows page after page, a list leaf's two
    level streams in one pass) and the numpy way make the same bytes."""
    from shufflefs.formats.parquet import streams as st

    if st._gather is None:
        pytest.skip("compiled gather not built")
    path = files[name]
    index = scan_file(path, make_format("parquet"))
    copy = _copy(path, index, list(range(len(index.footer.group_rows))))
    order = np.random.default_rng(5).permutation(index.n)
    view = plan_view(index.footer, index.sizes, np.concatenate([order, order[:99]]), 1_100, page_bytes=16 << 10)
    size = [view.group_range(g)[1] - view.group_range(g)[0] for g in range(view.n_groups)]
    fast = [encode_rows(view, g, view.rows(g), copy, np.empty(size[g], np.uint8)).copy() for g in range(view.n_groups)]
    monkeypatch.setattr(st, "_gather", None)
    for g in range(view.n_groups):
        assert np.array_equal(fast[g], encode_rows(view, g, view.rows(g), copy, np.empty(size[g], np.uint8))), g


def test_the_page_gather_checks_every_run_before_copying():
    from shufflefs.formats.parquet.encode import _gather

    if _gather is None:
        pytest.skip("compiled gather not built")
    src = np.arange(100, dtype=np.uint8)
    offsets = np.array([0, 10, 20, 90], np.int64)
    sizes = np.array([3, 0, 5, 10], np.uint16)
    ends = np.zeros(2, np.int64)

    def gather(out, rows, bounds, dst=np.zeros(0, np.int64), offs=offsets, *also):
        _gather.gather_rows(out, src, np.asarray(rows, np.int64), offs, sizes, 2, np.asarray(bounds, np.int64),
                            dst, ends, *also)

    out = np.zeros(30, np.uint8)
    gather(out, [2, 0, 1, 3], [0, 2, 4], np.array([0, 12], np.int64))
    assert out[:8].tolist() == [20, 21, 22, 23, 24, 0, 1, 2] and out[12:22].tolist() == list(range(90, 100))
    assert ends.tolist() == [8, 22]
    gather(out, [3, 0], [0, 1, 2])  # contiguous pages
    assert ends.tolist() == [10, 13]
    for rows, bounds, dst, offs, what in [
            ([4], [0, 1, 1], None, offsets, "row 4 of 4"),  # a row the sizes do not have
            ([-1], [0, 1, 1], None, offsets, "row -1"),
            ([0, 1], [0, 3, 2], None, offsets, "page 0"),  # page bounds out of order
            ([3], [0, 1, 1], None, np.array([0, 10, 20, 95], np.int64), "outside its buffers"),  # past src
            ([0], [0, 1, 1], None, np.array([-1, 10, 20, 90], np.int64), "outside its buffers"),
            ([3, 3, 3, 3], [0, 4, 4], None, offsets, "outside its buffers"),  # 40 bytes into 30
            ([0], [0, 1, 1], np.array([31, 0], np.int64), offsets, "starts outside")]:
        out = np.zeros(30, np.uint8)
        with pytest.raises(IndexError, match=what):
            gather(out, rows, bounds, np.zeros(0, np.int64) if dst is None else dst, offs)
        if what != "outside its buffers" or rows[0] != 3 or len(rows) == 1:
            assert not out.any(), what
    with pytest.raises(ValueError, match="out2"):
        gather(np.zeros(30, np.uint8), [0], [0, 1, 1], np.zeros(0, np.int64), offsets, np.zeros(29, np.uint8), src)
    with pytest.raises(ValueError, match="wide"):
        _gather.gather_rows(out, src, np.zeros(1, np.int64), offsets, sizes, 3, np.array([0, 1, 1], np.int64),
                            np.zeros(0, np.int64), ends)


def test_runs_that_are_not_the_layout_s_are_an_error_not_a_page(files):
    """A view laid out for rows of other sizes than the copy's runs (an index that does not fit
    the copy): every run stays inside its buffers, and the page that would end elsewhere than
    the layout says is a FormatError naming the column, never a page of wrong bytes."""
    from shufflefs.errors import FormatError

    path = files["pyarrow"]
    index = scan_file(path, make_format("parquet"))
    copy = _copy(path, index, list(range(len(index.footer.group_rows))))
    col = next(col for col in index.sizes.columns if isinstance(col.values, np.ndarray))
    sizes = col.values
    forged = sizes.astype(np.uint64)
    forged[0] += 1  # the layout gives row 0 one value byte more than its run in the copy
    object.__setattr__(col, "values", forged)
    try:
        view = plan_view(index.footer, index.sizes, np.arange(index.n), 1_000, page_bytes=16 << 10)
    finally:
        object.__setattr__(col, "values", sizes)
    with pytest.raises(FormatError, match="the copy is not the index's"):
        encode_rows(view, 0, view.rows(0), copy, np.empty(view.group_range(0)[1] - view.group_range(0)[0], np.uint8))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_the_page_gather_copies_what_slicing_copies(dtype):
    """Random rows (repeats, empty runs, empty pages), pages placed apart or one after the other,
    one stream or two: every byte where slicing puts it, every page's end reported."""
    from shufflefs.formats.parquet.encode import _gather

    if _gather is None:
        pytest.skip("compiled gather not built")
    rng = np.random.default_rng(int(np.dtype(dtype).itemsize))
    for _ in range(50):
        n_src = int(rng.integers(1, 40))
        sizes = rng.integers(0, 30, n_src).astype(dtype)
        sizes[rng.random(n_src) < 0.2] = 0
        offsets = np.zeros(n_src, np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        offsets = offsets[rng.permutation(n_src)]  # runs in any order in the source
        src = rng.integers(0, 256, int(offsets.max()) + int(sizes.max()) + 5, dtype=np.uint8)
        src2 = rng.integers(0, 256, len(src), dtype=np.uint8)
        rows = rng.integers(0, n_src, int(rng.integers(0, 60)))
        cuts = np.sort(rng.integers(0, len(rows) + 1, int(rng.integers(0, 5))))
        bounds = np.concatenate([[0], cuts, [len(rows)]]).astype(np.int64)
        pages = [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        run = {x: (int(offsets[x]), int(offsets[x]) + int(sizes[x])) for x in range(n_src)}
        want = [b"".join(src[slice(*run[x])].tobytes() for x in p.tolist()) for p in pages]
        apart = bool(rng.integers(2))
        dst = np.cumsum([0] + [len(w) + 7 for w in want[:-1]]).astype(np.int64) if apart else np.zeros(0, np.int64)
        out = np.zeros(int(dst[-1]) + len(want[-1]) + 3 if apart else sum(map(len, want)) + 3, np.uint8)
        out2 = np.zeros_like(out)
        ends = np.full(len(pages), -1, np.int64)
        _gather.gather_rows(out, src, rows.astype(np.int64), offsets, sizes, np.dtype(dtype).itemsize, bounds, dst,
                            ends, out2, src2)
        starts = dst if apart else np.concatenate([[0], ends[:-1]]).astype(np.int64)
        for p, (w, a) in enumerate(zip(want, starts.tolist())):
            assert out[a: a + len(w)].tobytes() == w and ends[p] == a + len(w)
            w2 = b"".join(src2[slice(*run[x])].tobytes() for x in pages[p].tolist())
            assert out2[a: a + len(w2)].tobytes() == w2
