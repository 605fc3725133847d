"""Level: pure (no mount, no daemon).

Parquet views of the list layouts older writers (parquet-mr, Hive, parquet-avro) use: two-level
lists (``repeated int32 array``), repeated groups named ``array`` or ``*_tuple`` (a list of
structs even with one field), bare repeated fields at the top and inside a struct.  pyarrow
writes only the standard three-level form, so each source is a pyarrow file whose schema is
rewritten to the legacy form with the same levels (the pages stay valid) and no Arrow schema;
its view must read back as what pyarrow reads from that source."""

from __future__ import annotations

import io

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from shufflefs.formats.parquet import SourceGroups, build_sizes, plan_view, read_footer, view_bytes  # noqa: E402
from shufflefs.formats.parquet.thrift import STRUCT, Writer, read_struct  # noqa: E402

INT32, REQUIRED, OPTIONAL, REPEATED, LIST = 1, 0, 1, 2, 3


def _with_schema(raw: bytes, schema: list[dict]) -> bytes:
    """``raw`` with its footer's schema replaced by ``schema`` and its key-value metadata dropped."""
    n = int.from_bytes(raw[-8:-4], "little")
    buf = raw[len(raw) - 8 - n : -8]
    meta, _ = read_struct(buf)
    w = Writer()
    w.begin_struct()
    w.raw(1, meta.types[1], buf[slice(*meta.raw[1])])
    w.begin_list(2, STRUCT, len(schema))
    for e in schema:
        w.begin_struct()
        if "type" in e:
            w.i32(1, e["type"])
        if "rep" in e:
            w.i32(3, e["rep"])
        w.binary(4, e["name"].encode())
        if "kids" in e:
            w.i32(5, e["kids"])
        if "conv" in e:
            w.i32(6, e["conv"])
        w.end_struct()
    for fid in (3, 4, 6):
        w.raw(fid, meta.types[fid], buf[slice(*meta.raw[fid])])
    w.end_struct()
    foot = w.getvalue()
    return raw[: len(raw) - 8 - n] + foot + len(foot).to_bytes(4, "little") + b"PAR1"


def _lists(rng, n, make, p_null=0.15):
    return [None if rng.random() < p_null else [make() for _ in range(rng.integers(0, 4))] for _ in range(n)]


def _cases(rng, n):
    ints = lambda: int(rng.integers(-99, 99))  # noqa: E731
    nonnull = pa.field("element", pa.int32(), nullable=False)
    struct_x = pa.field("element", pa.struct([pa.field("x", pa.int32(), nullable=False)]), nullable=False)
    yield ("two-level list", pa.array(_lists(rng, n, ints), pa.list_(nonnull)), True,
           [dict(name="schema", kids=1), dict(name="a", rep=OPTIONAL, kids=1, conv=LIST),
            dict(name="array", rep=REPEATED, type=INT32)])
    for name in ("array", "a_tuple"):
        yield (f"repeated group {name}", pa.array(_lists(rng, n, lambda: {"x": ints()}), pa.list_(struct_x)), True,
               [dict(name="schema", kids=1), dict(name="a", rep=OPTIONAL, kids=1, conv=LIST),
                dict(name=name, rep=REPEATED, kids=1), dict(name="x", rep=REQUIRED, type=INT32)])
    yield ("bare repeated field", pa.array(_lists(rng, n, ints, 0), pa.list_(nonnull)), False,
           [dict(name="schema", kids=1), dict(name="a", rep=REPEATED, type=INT32)])
    inner = pa.struct([pa.field("v", pa.int32())])
    s = pa.struct([pa.field("r", pa.list_(pa.field("element", inner, nullable=False)), nullable=False)])
    values = [None if rng.random() < 0.1 else {"r": [{"v": None if rng.random() < 0.2 else ints()}
                                                     for _ in range(rng.integers(0, 3))]} for _ in range(n)]
    yield ("bare repeated group in a struct", pa.array(values, s), True,
           [dict(name="schema", kids=1), dict(name="a", rep=OPTIONAL, kids=1), dict(name="r", rep=REPEATED, kids=1),
            dict(name="v", rep=OPTIONAL, type=INT32)])


@pytest.mark.parametrize("k", range(5))
def test_legacy_list_layouts_read_back_as_their_source(k):
    rng = np.random.default_rng(k)
    what, arr, nullable, schema = list(_cases(rng, 3_000))[k]
    t = pa.table({"a": arr}, schema=pa.schema([pa.field("a", arr.type, nullable=nullable)]))
    buf = io.BytesIO()
    pq.write_table(t, buf, store_schema=False, row_group_size=700)
    raw = _with_schema(buf.getvalue(), schema)
    source = pq.read_table(io.BytesIO(raw))
    assert source.to_pylist() == t.to_pylist(), what  # the rewritten source holds the same rows
    footer = read_footer(len(raw), lambda a, b: raw[a:b], what)
    groups = SourceGroups(io.BytesIO(raw), footer, what, keep=16)
    sizes = build_sizes(footer, groups, what)
    order = rng.permutation(3_000)
    view = pq.read_table(io.BytesIO(view_bytes(plan_view(footer, sizes, order, 1_000, page_bytes=500), groups)))
    assert pq.ParquetFile(io.BytesIO(view_bytes(plan_view(footer, sizes, order, 1_000), groups))).schema.equals(
        pq.ParquetFile(io.BytesIO(raw)).schema), what
    assert view.schema.equals(source.schema) and view.equals(source.take(order)), what
