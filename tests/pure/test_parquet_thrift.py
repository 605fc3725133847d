"""Level: pure (no mount, no daemon).

The Thrift compact protocol of Parquet footers and the page arithmetic of Parquet views: what the
writer writes the reader reads back, raw spans splice unchanged, damaged bytes are a clear error,
and every size the layout predicts (page headers, level sections) is the size the encoder writes,
with levels that an independent decoder of the hybrid encoding reads back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shufflefs.errors import FormatError
from shufflefs.formats.parquet import thrift
from shufflefs.formats.parquet.footer import parse_footer
from shufflefs.formats.parquet.pages import encode_levels, header, header_size, levels_size
from shufflefs.formats.parquet.thrift import Reader, ThriftError, Writer, read_struct

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I64 = st.integers(-(2**63), 2**63 - 1)


def uvarint(b: bytes, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        c = b[pos]
        pos += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, pos
        shift += 7


def decode_hybrid(section: bytes, width: int, n: int) -> np.ndarray:
    """An independent reader of a level section (4-byte length, then RLE or bit-packed runs)."""
    length = int.from_bytes(section[:4], "little")
    assert length == len(section) - 4
    body, pos, out = section[4:], 0, []
    while pos < len(body):
        head, pos = uvarint(body, pos)
        if head & 1:
            nbytes = (head >> 1) * width
            bits = np.unpackbits(np.frombuffer(body[pos : pos + nbytes], np.uint8), bitorder="little")
            out.extend((bits.reshape(-1, width) << np.arange(width)).sum(axis=1).tolist())
            pos += nbytes
        else:
            nb = (width + 7) // 8
            out.extend([int.from_bytes(body[pos : pos + nb], "little")] * (head >> 1))
            pos += nb
    assert len(out) >= n
    return np.array(out[:n])


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 300), st.sampled_from(["i32", "i64", "bin", "bool", "list", "struct"]),
                          I64, st.binary(max_size=40)), max_size=20, unique_by=lambda t: t[0]))
def test_what_the_writer_writes_the_reader_reads(fields):
    fields = sorted(fields, key=lambda f: f[0])
    w = Writer()
    w.begin_struct()
    want = {}
    for fid, kind, num, blob in fields:
        if kind == "i32":
            v = num % (1 << 31)
            w.i32(fid, v)
        elif kind == "i64":
            v = num
            w.i64(fid, v)
        elif kind == "bin":
            v = blob
            w.binary(fid, v)
        elif kind == "bool":
            v = num % 2 == 0
            w.boolean(fid, v)
        elif kind == "list":
            v = [blob] * (num % 20)
            w.begin_list(fid, thrift.BINARY, len(v))
            for x in v:
                w.elem_binary(x)
        else:
            w.begin_struct(fid)
            w.i64(1, num)
            w.end_struct()
            v = num
        want[fid] = v
    w.end_struct()
    data = w.getvalue()
    s, end = read_struct(data)
    assert end == len(data)
    for fid, kind, *_ in fields:
        got = s.fields[fid]
        assert (got.fields[1] if kind == "struct" else got) == want[fid]


@SETTINGS
@given(st.lists(st.binary(max_size=30), max_size=40), st.integers(0, 2**40))
def test_a_raw_span_splices_unchanged(items, num):
    """A field copied from its span (`Struct.raw`) into a new struct reads back the same."""
    w = Writer()
    w.begin_struct()
    w.begin_list(2, thrift.BINARY, len(items))
    for x in items:
        w.elem_binary(x)
    w.i64(3, num)
    w.end_struct()
    src = w.getvalue()
    s, _ = read_struct(src)
    a, b = s.raw[2]
    w2 = Writer()
    w2.begin_struct()
    w2.i32(1, 7)
    w2.raw(5, thrift.LIST, src[a:b])
    w2.end_struct()
    t, _ = read_struct(w2.getvalue())
    assert t.fields[5] == items and t.fields[1] == 7


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_read_or_fail_with_a_thrift_error(data):
    try:
        read_struct(data)
    except ThriftError:
        pass


def test_declared_lengths_past_the_end_are_refused_before_allocating():
    with pytest.raises(ThriftError, match="past the end"):
        Reader(bytes([0x18]) + b"\xff\xff\xff\xff\x0f").struct()  # binary field of 4 GiB
    with pytest.raises(ThriftError, match="longer than the bytes left"):
        Reader(bytes([0x19, 0xF5]) + b"\xff\xff\xff\xff\x0f").struct()  # list of 4 G elements
    with pytest.raises(ThriftError, match="keyed by structs"):
        Reader(bytes([0x1B, 0x01, 0xC5, 0x00, 0x02])).struct()  # a map whose key is a struct
    deep = bytes([0x1C]) * 100  # structs in structs
    with pytest.raises(ThriftError, match="nested deeper"):
        Reader(deep).struct()


@SETTINGS
@given(st.binary(min_size=0, max_size=300), st.integers(12, 10**6))
def test_a_damaged_tail_is_a_format_error(garbage, size):
    tail = garbage + len(garbage).to_bytes(4, "little") + b"PAR1"
    try:
        parse_footer(tail, max(size, len(tail) + 4), "x.parquet")
    except FormatError as e:
        assert e.path == "x.parquet" and e.message


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_page_header_sizes_are_predicted(body, entries):
    h = header(body, entries)
    assert len(h) == int(header_size(np.array([body]), np.array([entries]))[0])
    s, end = read_struct(h)
    assert end == len(h) and s.fields[2] == s.fields[3] == body and s.fields[5].fields[1] == entries


@SETTINGS
@given(st.integers(1, 5000), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_level_sections_have_their_predicted_size_and_decode_back(n, width, seed):
    levels = np.random.default_rng(seed).integers(0, 1 << width, n).astype(np.uint8)
    sec = encode_levels(levels, width)
    assert len(sec) == levels_size(n, width) == int(levels_size(np.array([n]), width)[0])
    assert np.array_equal(decode_hybrid(sec, width, n), levels)


def test_varint_lengths():
    v = np.array([0, 127, 128, 16383, 16384, 2**31 - 1, 2**62])
    want = [len(_varint(int(x))) for x in v]
    assert thrift.varint_len(v).tolist() == want


def _varint(v: int) -> bytes:
    w = Writer()
    w.varint(v)
    return w.getvalue()
