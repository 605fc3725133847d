"""Level: pure (no mount, no daemon).

Parquet views of any nesting: random schemas (lists, large and fixed-size lists, structs, maps,
required and optional fields, dictionaries) with nulls at every level, written by pyarrow with
random settings and row groups, shown in random orders with repeated rows, row groups of random
sizes and pages of a few rows, read back by pyarrow as exactly the source's rows; and the level
entries and values of a leaf come out the same whether Arrow hands a row group over in one chunk
or in many (sliced arrays, offsets into their buffers)."""

from __future__ import annotations

import decimal
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from shufflefs.errors import FormatError  # noqa: E402
from shufflefs.formats.parquet import SourceGroups, build_sizes, plan_view, read_footer, view_bytes  # noqa: E402
from shufflefs.formats.parquet.decode import _concat, leaf_data  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LEAVES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint32(), pa.uint64(), pa.float16(), pa.float32(),
          pa.float64(), pa.bool_(), pa.string(), pa.large_string(), pa.binary(), pa.binary(3), pa.timestamp("ms"),
          pa.timestamp("s", tz="UTC"), pa.timestamp("ns"), pa.date32(), pa.time64("us"), pa.duration("s"),
          pa.decimal128(7, 2), pa.decimal128(30, 5), pa.decimal256(50, 3)]


def _field(name: str, t, nullable: bool):
    return pa.field(name, t, nullable=nullable)


def types():
    leaf = st.sampled_from(LEAVES)

    def nest(children):
        return st.one_of(
            st.tuples(children, st.booleans()).map(lambda a: pa.list_(_field("element", *a))),
            st.tuples(children, st.booleans()).map(lambda a: pa.large_list(_field("element", *a))),
            st.tuples(children, st.booleans()).map(lambda a: pa.list_(_field("element", *a), 2)),
            st.lists(st.tuples(children, st.booleans()), min_size=1, max_size=3).map(
                lambda fs: pa.struct([_field(f"f{i}", t, n) for i, (t, n) in enumerate(fs)])),
            st.tuples(children, st.booleans()).map(lambda a: pa.map_(pa.string(), _field("value", *a))),
        )

    return st.recursive(leaf, nest, max_leaves=5)


def value(t, rng: np.random.Generator, nullable: bool = True, p: float = 0.2):
    """A random Python value of Arrow type ``t`` (None only where ``nullable``)."""
    if nullable and rng.random() < p:
        return None
    if pa.types.is_fixed_size_list(t):
        return [value(t.value_type, rng, t.value_field.nullable) for _ in range(t.list_size)]
    if pa.types.is_map(t):
        keys = {f"k{int(k)}" for k in rng.integers(0, 9, rng.integers(0, 4))}
        return [(k, value(t.item_type, rng, t.item_field.nullable)) for k in sorted(keys)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [value(t.value_type, rng, t.value_field.nullable) for _ in range(rng.integers(0, 4))]
    if pa.types.is_struct(t):
        return {f.name: value(f.type, rng, f.nullable) for f in t}
    if pa.types.is_boolean(t):
        return bool(rng.random() < 0.5)
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return int(rng.integers(info.min, info.max, endpoint=True, dtype=t.to_pandas_dtype()))
    if pa.types.is_float16(t):
        return np.float16(rng.standard_normal())
    if pa.types.is_floating(t):
        return float(rng.standard_normal())
    if pa.types.is_decimal(t):
        top = 10 ** min(t.precision, 15)
        return decimal.Decimal(int(rng.integers(-top + 1, top))).scaleb(-t.scale)
    if pa.types.is_fixed_size_binary(t):
        return bytes(rng.integers(0, 256, t.byte_width, dtype=np.uint8))
    if pa.types.is_binary(t):
        return bytes(rng.integers(0, 256, rng.integers(0, 20), dtype=np.uint8))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "".join(rng.choice(list("abcé€ "), rng.integers(0, 12)))
    return int(rng.integers(-(10**9), 10**9))  # timestamps, dates, times, durations as counts


def table(draw_types: list, n: int, seed: int):
    rng = np.random.default_rng(seed)
    cols = {}
    for i, (t, nullable) in enumerate(draw_types):
        cols[f"c{i}"] = pa.array([value(t, rng, nullable) for _ in range(n)], type=t)
    if n and rng.random() < 0.5:
        cols["dict"] = pa.array([value(pa.string(), rng) for _ in range(n)], pa.string()).dictionary_encode()
    schema = pa.schema([pa.field(k, v.type, nullable=(k == "dict" or draw_types[int(k[1:])][1]))
                        for k, v in cols.items()], metadata={"origin": "test", "n": str(n)})
    return pa.table(cols, schema=schema)


@SETTINGS
@given(st.lists(st.tuples(types(), st.booleans()), min_size=1, max_size=3), st.integers(0, 250),
       st.integers(0, 2**32 - 1), st.data())
def test_any_nesting_reads_back_as_the_source_rows(draw_types, n, seed, data):
    src = table(draw_types, n, seed)
    buf = io.BytesIO()
    pq.write_table(src, buf, row_group_size=data.draw(st.integers(1, 80)),
                   data_page_version=data.draw(st.sampled_from(["1.0", "2.0"])),
                   use_dictionary=data.draw(st.booleans()), compression=data.draw(st.sampled_from(["none", "snappy"])))
    raw = buf.getvalue()
    footer = read_footer(len(raw), lambda a, b: raw[a:b], "mem")
    groups = SourceGroups(io.BytesIO(raw), footer, "mem", keep=1_000)
    try:
        expected = pq.read_table(io.BytesIO(raw))
    except pa.ArrowException:  # pyarrow cannot read its own file (a null struct over a fixed-size list)
        with pytest.raises(FormatError, match="cannot be decoded"):
            build_sizes(footer, groups, "mem")
        return
    sizes = build_sizes(footer, groups, "mem")
    m = data.draw(st.integers(0, 2 * n)) if n else 0
    order = np.random.default_rng(seed).integers(0, n, m) if n else np.zeros(0, np.int64)
    if m and data.draw(st.booleans()):
        cuts = np.sort(np.random.default_rng(seed + 1).choice(np.arange(1, m), min(m - 1, 4), replace=False))
        rows_per_group = np.diff(np.concatenate([[0], cuts, [m]])).tolist()
    else:
        rows_per_group = data.draw(st.integers(1, 120))
    layout = plan_view(footer, sizes, order, rows_per_group, page_bytes=data.draw(st.sampled_from([1, 50, 1 << 20])))
    view = pq.read_table(io.BytesIO(view_bytes(layout, groups, "mem")))
    expected = expected.take(order)
    assert view.schema.equals(expected.schema, check_metadata=True)
    assert pf.plain(view).equals(pf.plain(expected))


def _same(a, b) -> None:
    for name in ("slots", "defs", "reps", "vals"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None and y is None) or np.array_equal(x, y), name
    va, vb = a.values, b.values
    if va.data is not None:
        assert np.array_equal(va.lens, vb.lens)
        for s1, s2, n in zip(va.starts.tolist(), vb.starts.tolist(), va.lens.tolist()):
            assert va.data[s1 : s1 + n].tobytes() == vb.data[s2 : s2 + n].tobytes()
    else:
        for x, y in ((va.fixed, vb.fixed), (va.bits, vb.bits)):
            assert (x is None and y is None) or np.array_equal(x, y)


@SETTINGS
@given(st.lists(st.tuples(types(), st.booleans()), min_size=1, max_size=2), st.integers(1, 120),
       st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_a_row_group_in_chunks_gives_the_same_levels_and_values(draw_types, n, seed, chunk):
    t = table(draw_types, n, seed)
    buf = io.BytesIO()
    pq.write_table(t, buf)
    raw = buf.getvalue()
    footer = read_footer(len(raw), lambda a, b: raw[a:b], "mem")
    try:
        whole = pq.read_table(io.BytesIO(raw)).combine_chunks()
    except pa.ArrowException:  # pyarrow cannot read its own file (see above)
        return
    chunked = pa.Table.from_batches(whole.to_batches(max_chunksize=chunk))
    for leaf in footer.leaves:
        one = leaf_data(leaf, whole.column(leaf.top).chunk(0), "mem")
        many = _concat([leaf_data(leaf, c, "mem") for c in chunked.column(leaf.top).chunks])
        _same(one, many)
