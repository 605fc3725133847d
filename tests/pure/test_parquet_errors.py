"""Level: pure (no mount, no daemon).

Bad Parquet input is a clear `FormatError` (the file, the offset, what is wrong), never a crash
and never a view of wrong bytes: files that are not Parquet or are cut short, damaged footers,
damaged pages, a source that is not the one indexed, and an index that does not fit its source."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from shufflefs.errors import FormatError  # noqa: E402
from shufflefs.formats.parquet import (RowSizes, SourceGroups, build_sizes, encode_group,  # noqa: E402
                                       footer_of_file, plan_view, sizes_of_file, view_bytes)
from shufflefs.formats.parquet.footer import parse_footer  # noqa: E402
from shufflefs.formats.parquet.sizes import ColumnSizes  # noqa: E402
from shufflefs.formats.parquet.thrift import read_struct  # noqa: E402

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _table(n: int = 4_000, seed: int = 0) -> "pa.Table":
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": np.arange(n),
        "text": pa.array(["x" * int(k) for k in rng.integers(0, 50, n)]),
        "tags": pa.array([[int(v)] * int(v % 3) for v in rng.integers(0, 9, n)], pa.list_(pa.int32())),
    })


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good.parquet"
    pq.write_table(_table(), path, row_group_size=1_000, compression="none", use_dictionary=False)
    return path


def test_a_file_that_is_not_parquet_is_named_as_such(tmp_path):
    p = tmp_path / "a.parquet"
    p.write_bytes(b'{"a": 1}\n' * 100)
    with pytest.raises(FormatError, match="no Parquet magic") as e:
        footer_of_file(str(p))
    assert e.value.path == str(p) and e.value.offset == 896
    p.write_bytes(b"PAR1")
    with pytest.raises(FormatError, match="too short"):
        footer_of_file(str(p))


def test_a_cut_file_is_a_format_error(good, tmp_path):
    data = good.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 20):
        p = tmp_path / f"cut{cut}.parquet"
        p.write_bytes(data[:cut])
        with pytest.raises(FormatError):
            footer_of_file(str(p))


def test_a_footer_length_past_the_file_is_refused(good, tmp_path):
    data = bytearray(good.read_bytes())
    data[-8:-4] = (len(data)).to_bytes(4, "little")
    p = tmp_path / "long.parquet"
    p.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="does not fit the file"):
        footer_of_file(str(p))


@SETTINGS
@given(st.data())
def test_a_damaged_footer_parses_or_is_a_format_error(data):
    buf = io.BytesIO()
    pq.write_table(_table(50), buf, row_group_size=20)
    raw = bytearray(buf.getvalue())
    n = int.from_bytes(raw[-8:-4], "little")
    start = len(raw) - 8 - n
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(start, len(raw) - 9))
        raw[pos] = data.draw(st.integers(0, 255))
    raw = bytes(raw)
    try:
        footer = parse_footer(raw, len(raw), "f.parquet")
        groups = SourceGroups(io.BytesIO(raw), footer, "f.parquet", keep=8)
        sizes = build_sizes(footer, groups, "f.parquet")
    except FormatError as e:
        assert e.path == "f.parquet"
        return
    # a footer damaged yet still consistent: the view holds what pyarrow reads from the source
    # (compared as Python rows: a damaged Arrow schema can ask for types `take` has no kernel for)
    order = np.arange(footer.num_rows)[::-1]
    view = pq.read_table(io.BytesIO(view_bytes(plan_view(footer, sizes, order, 7), groups)))
    source = pq.read_table(io.BytesIO(raw))
    rows = source.to_pylist()
    assert view.schema.equals(source.schema) and view.to_pylist() == [rows[i] for i in order.tolist()]


def test_a_damaged_footer_whose_fields_shift_is_a_format_error_not_a_view_readers_refuse():
    """One byte of a footer damaged so that both this parser and pyarrow still read it, each
    its own way: the last row group's STOP made a field, so the key-value metadata's list is
    read as that field's and ``created_by`` takes the key-value metadata's number.  A view
    copied that field's bytes as the key-value list, and pyarrow could not read the view's
    footer ("Couldn't deserialize thrift").  Found by the fuzz test above."""
    buf = io.BytesIO()
    pq.write_table(_table(50), buf, row_group_size=20)
    raw = bytearray(buf.getvalue())
    at = raw.index(b"\x19\x1c\x18\x0cARROW:schema") - 1  # the last row group's STOP, before field 5
    assert raw[at] == 0
    raw[at] = 0x1D  # a field: the next id, a map
    raw = bytes(raw)
    pq.ParquetFile(io.BytesIO(raw))  # pyarrow reads this footer (it skips what it does not know)
    with pytest.raises(FormatError, match="key-value metadata is not a list") as e:
        parse_footer(raw, len(raw), "f.parquet")
    assert e.value.path == "f.parquet"


def test_a_damaged_page_names_its_row_group(good, tmp_path):
    bad = tmp_path / "bad.parquet"
    shutil.copy(good, bad)
    footer, sizes = sizes_of_file(str(good))
    md = pq.ParquetFile(good).metadata
    at = md.row_group(2).column(1).data_page_offset
    with open(bad, "r+b") as f:  # the page header of a chunk of row group 2: garbage
        f.seek(at)
        f.write(b"\xff" * 16)
    with pytest.raises(FormatError, match="row group 2 cannot be decoded") as e:
        sizes_of_file(str(bad))
    assert e.value.path == str(bad) and e.value.offset == md.row_group(2).column(0).data_page_offset
    # an index of the good file, a view drawing from row group 2 of the damaged one (the same
    # footer, so it passes for the same version): the encoder refuses, naming the row group
    layout = plan_view(footer, sizes, np.arange(2_000, 3_000), 1_000)
    with pytest.raises(FormatError, match="row group 2 cannot be decoded"):
        encode_group(layout, 0, SourceGroups(str(bad), footer, str(bad)), path=str(bad))


def test_damaged_values_give_an_error_not_a_view(good, tmp_path):
    """A length prefix of a PLAIN string changed: the decoder refuses the page or decodes rows of
    other sizes than the index holds; either way no bytes are served."""
    footer, sizes = sizes_of_file(str(good))
    data = bytearray(good.read_bytes())
    md = pq.ParquetFile(good).metadata
    _, at = read_struct(bytes(data), md.row_group(1).column(1).data_page_offset)  # past the page header
    body = data.index(b"x" * 20, at)  # the first value of 20+ bytes of the text column in group 1
    prefix = body - 4
    length = int.from_bytes(data[prefix:body], "little")
    data[prefix:body] = (length - 3).to_bytes(4, "little")
    bad = tmp_path / "values.parquet"
    bad.write_bytes(bytes(data))
    layout = plan_view(footer, sizes, np.arange(1_000, 2_000)[::-1], 500)
    with pytest.raises(FormatError, match="cannot be decoded|does not fit the source"):
        for g in range(layout.n_groups):
            encode_group(layout, g, SourceGroups(str(bad), footer, str(bad)), path=str(bad))


def test_another_file_is_not_taken_for_the_indexed_one(good, tmp_path):
    other = tmp_path / "other.parquet"
    pq.write_table(_table(seed=1), other, row_group_size=1_000, compression="none", use_dictionary=False)
    footer_a, sizes_a = sizes_of_file(str(good))
    footer_b = footer_of_file(str(other))
    with pytest.raises(FormatError, match="another version"):
        plan_view(footer_b, sizes_a, np.arange(10), 5)
    layout = plan_view(footer_a, sizes_a, np.arange(10), 5)
    with pytest.raises(FormatError, match="not the version that was indexed"):
        encode_group(layout, 0, SourceGroups(str(other), footer_a, str(other)))


@pytest.mark.parametrize("what", ["values", "entries"])
def test_an_index_that_does_not_fit_the_source_gives_no_bytes(good, what):
    footer, sizes = sizes_of_file(str(good))
    col = 2 if what == "entries" else 1  # tags (repeated) or text
    forged = np.array(getattr(sizes.columns[col], what), np.int64, copy=True)
    forged[1_234] += 1 if what == "values" else 2
    cols = list(sizes.columns)
    cols[col] = ColumnSizes(forged if what == "values" else cols[col].values,
                            forged if what == "entries" else cols[col].entries)
    bad = RowSizes(sizes.n_rows, sizes.group_starts, tuple(cols), sizes.booleans, sizes.digest)
    order = np.arange(4_000)[::-1]
    layout = plan_view(footer, bad, order, 1_000)
    groups = SourceGroups(str(good), footer, str(good))
    assert len(encode_group(layout, 0, groups)) == np.diff(layout.group_range(0))[0]  # rows 3999..3000: fine
    with pytest.raises(FormatError, match="row 234 of the source .* the index does not fit the source"):
        encode_group(layout, 2, groups, path=str(good))  # rows 1999..1000 hold row 1234 (row 234 of group 1)


def test_row_ids_outside_the_source_are_refused(good):
    footer, sizes = sizes_of_file(str(good))
    with pytest.raises(ValueError, match="row ids"):
        plan_view(footer, sizes, np.array([0, 4_000]), 10)
    with pytest.raises(ValueError, match="add up"):
        plan_view(footer, sizes, np.arange(10), [4, 5])
