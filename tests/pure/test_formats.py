"""Level: pure (no mount, no daemon).

Record formats: every scan tiles the file exactly, agrees with an independent parser, and
reports bad input as a FormatError at the right offset."""

from __future__ import annotations

import csv
import io
import os
import struct

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shufflefs.errors import FormatError, StaleSourceError
from shufflefs.formats import (
    FORMATS,
    CsvFormat,
    FixedFormat,
    Format,
    FormatRule,
    LinesFormat,
    NpyFormat,
    TFRecordFormat,
    load_or_build_index,
    make_format,
    parse_format_option,
    resolve_format,
    scan_file,
)
from shufflefs.formats.npy import Columns, c_order_header, columns_of, header_with_rows, row_kind
from shufflefs.formats.lines import record_ends
from shufflefs.index.table import IndexCache, RecordIndex

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- helpers


def arr(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype=np.uint8)


def records(idx: RecordIndex, data: bytes) -> list[bytes]:
    """Each record's bytes as the view serves them (a torn last line as it is: views give it last)."""
    return [data[a:b] for a, b in zip(idx.bounds[:-1].tolist(), idx.bounds[1:].tolist())]


def view(idx: RecordIndex, data: bytes, order=None) -> bytes:
    recs = records(idx, data)
    if order is not None:
        recs = [recs[i] for i in order]
    return data[: idx.header_end] + b"".join(recs) + data[idx.trailer_start :]


def check_tiles(idx: RecordIndex, data: bytes, fmt: Format) -> None:
    """header + records + trailer is the file; sizes agree."""
    assert idx.size == len(data)
    assert idx.bounds.dtype == np.int64
    assert np.all(np.diff(idx.bounds) > 0), "records must be non-empty and in order"
    expected = data
    assert view(idx, data) == expected
    assert idx.view_size == len(expected)
    assert fmt.view_size(len(data), data[-1] if data else None) == idx.view_size
    assert int(idx.out_lengths(np.arange(idx.n)).sum()) == idx.data_bytes


# --------------------------------------------------------------------------- lines


text_bytes = st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\n", b"\t", b" ", b"\xc3\xa9", b"{}"]), max_size=40).map(
    b"".join
)


def expected_lines(data: bytes, h: int) -> tuple[list[bytes], list[bytes]]:
    """Independent model of the documented layout: (header lines, record lines)."""
    lines = data.splitlines(keepends=True)
    complete = sum(1 for line in lines if line.endswith(b"\n"))
    cut = h if complete >= h else complete
    return lines[:cut], lines[cut:]


@SETTINGS
@given(data=text_bytes, h=st.integers(0, 3))
def test_lines_match_splitlines(data: bytes, h: int) -> None:
    fmt = LinesFormat(header_lines=h)
    idx = fmt.scan(arr(data), "t.txt")
    check_tiles(idx, data, fmt)
    header, recs = expected_lines(data, h)
    assert data[: idx.header_end] == b"".join(header)
    assert [data[a:b] for a, b in zip(idx.bounds[:-1], idx.bounds[1:])] == recs
    assert idx.add_newline == (len(data) > 0 and not data.endswith(b"\n"))


@SETTINGS
@given(data=text_bytes, chunk=st.integers(1, 9), csv_mode=st.booleans())
def test_record_ends_do_not_depend_on_chunking(data: bytes, chunk: int, csv_mode: bool) -> None:
    data = data.replace(b"{", b'"')  # some quotes for the quote-aware mode
    whole, q1 = record_ends(arr(data), quote_aware=csv_mode)
    pieces, q2 = record_ends(arr(data), quote_aware=csv_mode, chunk=chunk)
    assert q1 == q2 == data.count(b'"') * csv_mode
    assert whole.tolist() == pieces.tolist()


def test_lines_keep_crlf_inside_records() -> None:
    data = b'{"a":1}\r\n{"b":2}\r\nlast'
    idx = LinesFormat().scan(arr(data), "x.jsonl")
    assert records(idx, data) == [b'{"a":1}\r\n', b'{"b":2}\r\n', b"last"] and idx.torn == 1


def test_lines_empty_file() -> None:
    idx = LinesFormat().scan(np.zeros(0, dtype=np.uint8), "e.txt")
    assert (idx.size, idx.bounds.tolist(), idx.add_newline) == (0, [0], False)
    assert LinesFormat().view_size(0, None) == 0


@pytest.mark.parametrize(
    "data, bounds, add_newline, view_size",
    [
        (b"h\n", [2], False, 2),  # header only: no records
        (b"h", [0, 1], True, 1),  # header without newline: the line is the single (torn) record
        (b"h\nr", [2, 3], True, 3),
        (b"h\nr\n", [2, 4], False, 4),
    ],
)
def test_header_only_files(data: bytes, bounds: list[int], add_newline: bool, view_size: int) -> None:
    for fmt in (LinesFormat(header_lines=1), CsvFormat()):
        idx = fmt.scan(arr(data), "h.csv")
        assert (idx.bounds.tolist(), idx.add_newline, idx.view_size) == (bounds, add_newline, view_size)
        assert fmt.view_size(len(data), data[-1]) == view_size


def test_lines_progress_reaches_size() -> None:
    seen: list[int] = []
    data = b"x\n" * 1000
    record_ends(arr(data), seen.append, chunk=300)
    assert seen and seen[-1] == len(data) and seen == sorted(seen)


# --------------------------------------------------------------------------- csv

field_text = st.text(alphabet='ab,"\n x\u00e9', max_size=6)


@st.composite
def csv_files(draw) -> bytes:
    ncols = draw(st.integers(1, 3))
    rows = draw(st.lists(st.lists(field_text, min_size=ncols, max_size=ncols) | st.just([]), max_size=8))
    term = draw(st.sampled_from(["\n", "\r\n"]))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=term)
    writer.writerows(rows)
    text = out.getvalue()
    if text and draw(st.booleans()):
        text = text[: -len(term)]  # last line without its newline
    return text.encode()


def csv_rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode(), newline="")))


@SETTINGS
@given(data=csv_files())
def test_csv_agrees_with_csv_module(data: bytes) -> None:
    fmt = CsvFormat()
    idx = fmt.scan(arr(data), "t.csv")
    check_tiles(idx, data, fmt)
    rows = csv_rows(data)
    assert idx.n + (idx.header_end > 0) == len(rows)
    # Each record (and the header) parses as exactly one row, the same row as in the whole file.
    pieces = ([data[: idx.header_end]] if idx.header_end else []) + [
        data[a:b] for a, b in zip(idx.bounds[:-1], idx.bounds[1:])
    ]
    assert [csv_rows(p) for p in pieces] == [[r] for r in rows]


@SETTINGS
@given(data=csv_files(), seed=st.integers(0, 2**32 - 1))
def test_shuffled_csv_view_has_same_rows(data: bytes, seed: int) -> None:
    idx = CsvFormat().scan(arr(data), "t.csv")
    body = idx.n - idx.torn  # a torn last row stays last
    order = np.append(np.random.default_rng(seed).permutation(body), np.arange(body, idx.n))
    rows = csv_rows(view(idx, data, order))
    base = csv_rows(data)
    head = 1 if idx.header_end else 0
    assert rows[:head] == base[:head]
    assert rows[head:] == [base[head + i] for i in order]


@pytest.mark.parametrize(
    "data, offset",
    [
        (b'"h\n', 0),
        (b'h\na,b\n"x\ny\n', 6),
        (b'h\na,"b""\n', 2),
        (b'h\n"ok\n",1\nz,"open', 10),
    ],
)
def test_csv_unterminated_quote(data: bytes, offset: int) -> None:
    with pytest.raises(FormatError) as e:
        CsvFormat().scan(arr(data), "bad.csv")
    assert (e.value.path, e.value.offset) == ("bad.csv", offset)


# --------------------------------------------------------------------------- fixed


@SETTINGS
@given(rs=st.integers(1, 16), hb=st.integers(0, 10), n=st.integers(0, 20), extra=st.integers(0, 15), seed=st.integers(0, 99))
def test_fixed_records(rs: int, hb: int, n: int, extra: int, seed: int) -> None:
    extra %= rs
    data = np.random.default_rng(seed).bytes(hb + n * rs + extra)
    fmt = FixedFormat(record_size=rs, header_bytes=hb)
    if extra:
        with pytest.raises(FormatError) as e:
            fmt.scan(arr(data), "f.bin")
        assert e.value.offset == hb + n * rs
        return
    idx = fmt.scan(arr(data), "f.bin")
    check_tiles(idx, data, fmt)
    assert idx.n == n and idx.header_end == hb and idx.trailer_start == len(data)
    assert np.all(idx.lengths == rs)


def test_fixed_shorter_than_header() -> None:
    with pytest.raises(FormatError) as e:
        FixedFormat(record_size=4, header_bytes=8).scan(arr(b"abc"), "f.bin")
    assert e.value.offset == 0


@pytest.mark.parametrize("kwargs", [{"record_size": 0}, {"record_size": -3}, {"record_size": True}, {"record_size": 4, "header_bytes": -1}])
def test_fixed_rejects_bad_params(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FixedFormat(**kwargs)


# --------------------------------------------------------------------------- npy

dtypes = st.sampled_from(
    [np.dtype("u1"), np.dtype("<i4"), np.dtype(">f8"), np.dtype("<c8"), np.dtype([("a", "<i2"), ("b", "S3")]), np.dtype("U2")]
)


def npy_bytes(a: np.ndarray, version=None) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, a, version=version)
    return out.getvalue()


@SETTINGS
@given(
    dtype=dtypes,
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    version=st.sampled_from([None, (1, 0), (2, 0), (3, 0)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_npy_rows_are_records(dtype: np.dtype, shape: list[int], version, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = np.frombuffer(rng.bytes(dtype.itemsize * int(np.prod(shape))), dtype=dtype).reshape(shape)
    data = npy_bytes(a, version)
    fmt = NpyFormat()
    idx = fmt.scan(arr(data), "a.npy")
    check_tiles(idx, data, fmt)
    row_bytes = a[0:1].nbytes if len(a) else 0
    assert idx.n == (shape[0] if row_bytes else 0)
    for i, rec in enumerate(records(idx, data)):
        assert rec == a[i : i + 1].tobytes()
    order = rng.permutation(idx.n)
    shuffled = np.load(io.BytesIO(view(idx, data, order)))
    assert shuffled.dtype == a.dtype and shuffled.shape == a.shape
    if idx.n:
        assert shuffled.tobytes() == a[order].tobytes()


def test_npy_zero_dim_is_one_record() -> None:
    data = npy_bytes(np.array(3.5))
    idx = NpyFormat().scan(arr(data), "z.npy")
    assert idx.n == 1 and idx.trailer_start == len(data) and idx.lengths.tolist() == [8]


def test_npy_fortran_rows_are_indexed_like_their_c_twin() -> None:
    one = npy_bytes(np.asfortranarray(np.arange(5)))
    assert NpyFormat().scan(arr(one), "f.npy").n == 5
    a = np.arange(24, dtype=np.int32).reshape(4, 3, 2)
    f, c = npy_bytes(np.asfortranarray(a)), npy_bytes(a)
    assert b"'fortran_order': True" in f
    fi, ci = NpyFormat().scan(arr(f), "f.npy"), NpyFormat().scan(arr(c), "c.npy")
    assert np.array_equal(fi.bounds, ci.bounds)
    assert columns_of(f[: fi.header_end], "f.npy") == Columns(4, (3, 2))
    assert columns_of(c[: ci.header_end], "c.npy") is None
    assert columns_of(one[:128], "f.npy") is None  # one column: the bytes of its C twin
    assert c_order_header(f[: fi.header_end], "f.npy") == c[: ci.header_end]
    assert row_kind(f[: fi.header_end], "f") != row_kind(c[: ci.header_end], "c")
    assert b"'fortran_order': False" in header_with_rows(f[: fi.header_end], 2, "f.npy")


def test_npy_refuses_object_dtype() -> None:
    out = io.BytesIO()
    np.save(out, np.array([1, "x", None], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match="object"):
        NpyFormat().scan(arr(out.getvalue()), "o.npy")


def test_npy_size_must_match_header() -> None:
    data = npy_bytes(np.arange(12, dtype="<i4").reshape(4, 3))  # rows of 12 bytes
    header = len(data) - 48
    with pytest.raises(FormatError) as e:
        NpyFormat().scan(arr(data[:-5]), "s.npy")
    assert e.value.offset == header + 36  # start of the incomplete fourth row
    with pytest.raises(FormatError) as e:
        NpyFormat().scan(arr(data + b"xy"), "l.npy")
    assert e.value.offset == len(data)


def test_npy_empty_file_is_an_empty_view() -> None:
    idx = NpyFormat().scan(arr(b""), "e.npy")
    assert idx.n == 0 and idx.size == 0 and idx.view_size == 0


@pytest.mark.parametrize(
    "data, offset",
    [
        (b"\x93NUMPZ\x01\x00" + b"\x00" * 10, 0),
        (b"\x93NUMPY\x09\x00" + b"\x00" * 10, 6),
        (b"\x93NUMPY\x01\x00\xff", 8),  # header length cut short
        (b"\x93NUMPY\x01\x00\x40\x00{}", 8),  # header runs past the end
        (b"\x93NUMPY\x01\x00\x04\x00{}  ", 10),  # not the expected keys
    ],
)
def test_npy_bad_headers(data: bytes, offset: int) -> None:
    with pytest.raises(FormatError) as e:
        NpyFormat().scan(arr(data), "h.npy")
    assert e.value.offset == offset


# --------------------------------------------------------------------------- tfrecord


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def write_frames(payloads: list[bytes]) -> bytes:
    """A TFRecord writer kept independent of the one in the package."""
    out = bytearray()
    for p in payloads:
        n = struct.pack("<Q", len(p))
        out += n + struct.pack("<I", masked(crc32c.crc32c(n))) + p + struct.pack("<I", masked(crc32c.crc32c(p)))
    return bytes(out)


payload_lists = st.lists(st.binary(max_size=40), max_size=12)


@SETTINGS
@given(payloads=payload_lists, verify=st.booleans())
def test_tfrecord_frames(payloads: list[bytes], verify: bool) -> None:
    data = write_frames(payloads)
    fmt = TFRecordFormat(verify_data=verify)
    idx = fmt.scan(arr(data), "t.tfrecord")
    check_tiles(idx, data, fmt)
    assert idx.n == len(payloads) and idx.header_end == 0 and idx.trailer_start == len(data)
    assert [r[12:-4] for r in records(idx, data)] == payloads


def test_tfrecord_package_reads_original_and_shuffled(tmp_path) -> None:
    reader = pytest.importorskip("tfrecord.reader")
    payloads = [bytes([i]) * (i * 7 % 50) for i in range(30)]
    data = write_frames(payloads)
    idx = TFRecordFormat().scan(arr(data), "t.tfrecord")
    order = np.random.default_rng(1).permutation(idx.n)
    src, shuf = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    src.write_bytes(data)
    shuf.write_bytes(view(idx, data, order))
    from_src = [bytes(r) for r in reader.tfrecord_iterator(str(src))]
    starts = idx.bounds[:-1]
    assert from_src == [data[s + 12 : s + 12 + len(p)] for s, p in zip(starts, payloads)] == payloads
    assert [bytes(r) for r in reader.tfrecord_iterator(str(shuf))] == [payloads[i] for i in order]


@SETTINGS
@given(payloads=st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=8), data=st.data())
def test_tfrecord_corruption_names_the_frame(payloads: list[bytes], data) -> None:
    blob = bytearray(write_frames(payloads))
    starts = np.cumsum([0] + [16 + len(p) for p in payloads])
    k = data.draw(st.integers(0, len(payloads) - 1), label="frame")
    part = data.draw(st.sampled_from(["length", "length_crc", "data", "data_crc"]), label="part")
    within = {
        "length": (0, 8),
        "length_crc": (8, 12),
        "data": (12, 12 + len(payloads[k])),
        "data_crc": (12 + len(payloads[k]), 16 + len(payloads[k])),
    }[part]
    pos = int(starts[k]) + data.draw(st.integers(within[0], within[1] - 1), label="byte")
    blob[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    with pytest.raises(FormatError) as e:
        TFRecordFormat().scan(arr(bytes(blob)), "c.tfrecord")
    assert e.value.offset == starts[k]
    if part.startswith("data"):
        # Without data verification only the framing is checked, and it is intact.
        idx = TFRecordFormat(verify_data=False).scan(arr(bytes(blob)), "c.tfrecord")
        assert idx.bounds.tolist() == starts.tolist()
    else:
        assert "length" in e.value.message


@SETTINGS
@given(payloads=st.lists(st.binary(max_size=30), min_size=1, max_size=8), cut=st.integers(1, 45))
def test_tfrecord_truncated(payloads: list[bytes], cut: int) -> None:
    blob = write_frames(payloads)
    last = len(blob) - 16 - len(payloads[-1])
    cut = min(cut, len(blob) - last - 1)  # keep at least one byte of the last frame
    with pytest.raises(FormatError) as e:
        TFRecordFormat().scan(arr(blob[:-cut]), "t.tfrecord")
    assert e.value.offset == last
    assert "truncated" in e.value.message


def test_tfrecord_empty_file() -> None:
    idx = TFRecordFormat().scan(np.zeros(0, dtype=np.uint8), "e.tfrecord")
    assert idx.n == 0 and idx.bounds.tolist() == [0]


# --------------------------------------------------------------------------- files and cache


def test_scan_file_sets_stamp_and_handles_empty_files(tmp_path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"")
    idx = scan_file(p, LinesFormat())
    assert idx.n == 0 and idx.stamp is not None and idx.stamp.size == 0
    p.write_bytes(b"1\n2\n3")
    seen: list[int] = []
    idx = scan_file(p, LinesFormat(), seen.append)
    st_ = os.stat(p)
    assert (idx.stamp.size, idx.stamp.mtime_ns, idx.stamp.ino) == (st_.st_size, st_.st_mtime_ns, st_.st_ino)
    assert idx.bounds.tolist() == [0, 2, 4, 5] and idx.add_newline and seen[-1] == 5


def test_scan_file_reports_format_errors_with_path(tmp_path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"0123456")
    with pytest.raises(FormatError) as e:
        scan_file(p, FixedFormat(record_size=4))
    assert e.value.path == str(p) and e.value.offset == 4


class _Appending(LinesFormat):
    """A format whose scan changes the file under it, as a concurrent writer would."""

    def scan(self, data, path, progress=None):
        with open(path, "ab") as f:
            f.write(b"more\n")
        return super().scan(data, path, progress)


def test_scan_file_detects_change_during_scan(tmp_path) -> None:
    p = tmp_path / "a.txt"
    p.write_bytes(b"a\nb\n")
    with pytest.raises(StaleSourceError):
        scan_file(p, _Appending())


class _Counting(LinesFormat):
    def __init__(self, header_lines: int = 0) -> None:
        super().__init__(header_lines)
        self.scans = 0

    def scan(self, data, path, progress=None):
        self.scans += 1
        return super().scan(data, path, progress)


def test_cache_round_trip_and_rebuild(tmp_path) -> None:
    p = tmp_path / "d.txt"
    p.write_bytes(b"a\nbb\nccc")
    cache = IndexCache(tmp_path / "cache")
    fmt = _Counting()
    first = load_or_build_index(p, fmt, cache)
    second = load_or_build_index(p, fmt, cache)
    assert fmt.scans == 1
    assert second.bounds.tolist() == first.bounds.tolist() == [0, 2, 5, 8]
    assert second.add_newline and second.stamp == first.stamp

    # Other format parameters: another key, a fresh scan.
    other = _Counting(header_lines=1)
    assert load_or_build_index(p, other, cache).header_end == 2 and other.scans == 1

    # Same size, new content and mtime: the stale entry is not used.
    p.write_bytes(b"aaaa\nb\nc")
    st_ = os.stat(p)
    os.utime(p, ns=(st_.st_atime_ns, first.stamp.mtime_ns + 1_000_000_000))
    third = load_or_build_index(p, fmt, cache)
    assert fmt.scans == 2
    assert third.bounds.tolist() == [0, 5, 7, 8] and third.stamp != first.stamp


def test_unwritable_cache_still_indexes(tmp_path) -> None:
    p = tmp_path / "d.txt"
    p.write_bytes(b"a\n")
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    idx = load_or_build_index(p, LinesFormat(), IndexCache(blocker))
    assert idx.n == 1


# --------------------------------------------------------------------------- registry and rules


@pytest.mark.parametrize(
    "relpath, name, params",
    [
        ("a/b/x.jsonl", "lines", {"header_lines": 0}),
        ("x.NDJSON", "lines", {"header_lines": 0}),
        ("notes.txt", "lines", {"header_lines": 0}),
        ("t/X.CSV", "csv", {"header_lines": 1}),
        ("t.tsv", "lines", {"header_lines": 1}),
        ("m.npy", "npy", {}),
        ("r.tfrecord", "tfrecord", {"verify_data": True}),
        ("r.tfrecords", "tfrecord", {"verify_data": True}),
        ("x.bin", None, None),
        ("x.parquet", "parquet", {}),
        ("README", None, None),
    ],
)
def test_resolve_by_extension(relpath: str, name, params) -> None:
    fmt = resolve_format(relpath, [], {})
    if name is None:
        assert fmt is None
    else:
        assert (fmt.name, fmt.params()) == (name, params)


def test_bin_needs_a_record_size() -> None:
    fmt = resolve_format("d/x.bin", [], {"record_size": 64, "header_bytes": 8, "unrelated": 1})
    assert isinstance(fmt, FixedFormat) and fmt.params() == {"record_size": 64, "header_bytes": 8}


def test_rules_first_match_wins() -> None:
    rules = [
        FormatRule("raw/*.bin", "none", {}),
        FormatRule("special.bin", "fixed", {"record_size": 3}),
        FormatRule("*.bin", "fixed", {"record_size": 16}),
        FormatRule("*.jsonl", "passthrough", {}),
        FormatRule("*.rec", "fixed", {}),
    ]
    assert resolve_format("raw/x.bin", rules, {}) is None
    assert resolve_format("a/b/special.bin", rules, {}).record_size == 3  # basename match
    assert resolve_format("a/b/x.bin", rules, {}).record_size == 16
    assert resolve_format("other/raw/x.bin", rules, {}).record_size == 16  # "*" spans "/", the rule is anchored
    assert resolve_format("./deep/y.jsonl", rules, {}) is None
    assert resolve_format("z.rec", rules, {"record_size": 5}).record_size == 5  # defaults fill rules
    assert resolve_format("k.csv", rules, {}).name == "csv"
    with pytest.raises(ValueError, match="record_size"):
        resolve_format("z.rec", rules, {})


def test_make_format_errors() -> None:
    # every registered format has its scan tested here, in test_tar_scan.py, (compressed text) in
    # test_compressed_scan.py or (Parquet) in test_parquet_index.py: a new one must be added
    assert set(FORMATS) == {"lines", "csv", "fixed", "npy", "tfrecord", "tar",
                            "lines-gzip", "csv-gzip", "lines-zstd", "csv-zstd", "parquet"}
    with pytest.raises(ValueError, match="unknown format 'orc'"):
        make_format("orc", {})
    with pytest.raises(ValueError, match="no parameter 'record_size'"):
        make_format("lines", {"record_size": 4})
    with pytest.raises(ValueError, match="needs record_size"):
        make_format("fixed", {})
    with pytest.raises(ValueError, match="header_lines"):
        make_format("csv", {"header_lines": "one"})
    assert make_format("tfrecord", {"verify_data": False}).params() == {"verify_data": False}


def test_parse_format_option() -> None:
    rule = parse_format_option("*.rec=fixed:record_size=128,header_bytes=0x10")
    assert rule == FormatRule("*.rec", "fixed", {"record_size": 128, "header_bytes": 16})
    assert parse_format_option("data/*.log=lines") == FormatRule("data/*.log", "lines", {})
    assert parse_format_option("*.tfr = tfrecord: verify_data=false").params == {"verify_data": False}
    assert parse_format_option("*.dat=none").format == "none"
    assert parse_format_option("*.rec=fixed", defaults={"record_size": 8}).params == {}


@pytest.mark.parametrize(
    "text, message",
    [
        ("*.rec", "GLOB=FORMAT"),
        ("=lines", "GLOB=FORMAT"),
        ("*.rec=", "no format name"),
        ("*.rec=fixd:record_size=1", "unknown format 'fixd'"),
        ("*.rec=fixed", "needs record_size"),
        ("*.rec=fixed:record_size", "not key=value"),
        ("*.rec=fixed:record_size=1,record_size=2", "given twice"),
        ("*.rec=fixed:record_size=abc", "record_size must be an integer"),
        ("*.rec=lines:header=1", "no parameter 'header'"),
        ("*.rec=none:x=1", "takes no parameters"),
    ],
)
def test_parse_format_option_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        parse_format_option(text)
    assert repr(text) in str(e.value)


def test_damaged_cache_file_is_rebuilt(tmp_path):
    from shufflefs.formats import load_or_build_index, make_format
    from shufflefs.index.table import IndexCache, SourceStamp, cache_key

    src = tmp_path / "a.jsonl"
    src.write_bytes(b"a\nb\nc\n")
    fmt = make_format("lines", {})
    cache = IndexCache(tmp_path / "cache")
    first = load_or_build_index(src, fmt, cache)
    key = cache_key(src, SourceStamp.of(os.stat(src)), fmt.name, fmt.params())
    cache._file(key).write_bytes(b"not a zip file")
    again = load_or_build_index(src, fmt, cache)
    assert again.bounds.tolist() == first.bounds.tolist() == [0, 2, 4, 6]
