"""Level: pure (no mount).

Index cache entries are hints: an entry is used only if it is whole (its checksum), built for the
version asked for (its stamp) and its bounds fit the file (`Format.check_index`); windows gathered
over a wrong index fail their framing check (`Format.frame_check`) instead of being served."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shufflefs.formats import FramingError, check_file_index, gather_check, load_or_build_index, make_format
from shufflefs.formats.base import FRAMING_ENV
from shufflefs.formats.lines import check_lines, check_rows
from shufflefs.formats.tfrecord import check_frames, check_lengths, encode_frame
from shufflefs.index.table import INDEX_VERSION, IndexCache, RecordIndex, SourceStamp, _digest, cache_key
from shufflefs.windows.layout import assemble
from shufflefs.index.joined_index import PooledIndex

STAMP = SourceStamp(100, 5, 7, 9)


def test_round_trip_keeps_bounds_flag_and_stamp(tmp_path):
    cache = IndexCache(tmp_path)
    index = RecordIndex(100, np.array([0, 10, 40, 99], np.int64), True, STAMP)
    cache.store("k" * 32, index)
    got = cache.load("k" * 32, STAMP)
    assert got is not None and got.bounds.tolist() == [0, 10, 40, 99] and got.add_newline and got.stamp == STAMP


def _rewrite(cache: IndexCache, key: str, change) -> None:
    f = cache._file(key)
    with np.load(f) as z:
        bounds, meta = z["bounds"].copy(), json.loads(bytes(z["meta"]).decode())
    bounds, meta = change(bounds, meta)
    with open(f, "wb") as out:
        np.savez(out, bounds=bounds, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))


def _resum(bounds, meta):
    meta.pop("sum", None)
    return bounds, {**meta, "sum": _digest(bounds, meta)}


@pytest.mark.parametrize("change", [
    pytest.param(lambda b, m: (b + 1, m), id="bounds changed, checksum not"),
    pytest.param(lambda b, m: (b, {**m, "add_newline": False}), id="flag changed, checksum not"),
    pytest.param(lambda b, m: _resum(b, {**m, "stamp": {**m["stamp"], "ctime_ns": 1}}), id="another ctime"),
    pytest.param(lambda b, m: _resum(b, {**m, "stamp": {**m["stamp"], "ino": 8}}), id="another inode"),
    pytest.param(lambda b, m: _resum(b, {**m, "v": INDEX_VERSION - 1}), id="older version"),
    pytest.param(lambda b, m: _resum(b[::-1].copy(), m), id="descending"),
    pytest.param(lambda b, m: _resum(np.array([0, 10, 10, 99]), m), id="an empty record"),
    pytest.param(lambda b, m: _resum(b + 2, m), id="past the end"),
    pytest.param(lambda b, m: _resum(b.astype(np.float64), m), id="not int64"),
    pytest.param(lambda b, m: (b, {k: v for k, v in m.items() if k != "sum"}), id="no checksum"),
    pytest.param(lambda b, m: (b, ["not", "a", "dict"]), id="meta not an object"),
])
def test_an_entry_that_is_not_whole_or_not_of_this_version_is_missing(tmp_path, change):
    """Holds: SEMANTICS.md#changes-cache"""
    cache = IndexCache(tmp_path)
    cache.store("k" * 32, RecordIndex(100, np.array([0, 10, 40, 99], np.int64), True, STAMP))
    _rewrite(cache, "k" * 32, change)
    assert cache.load("k" * 32, STAMP) is None


def test_a_consistent_entry_for_another_stamp_is_missing_and_drop_removes_it(tmp_path):
    cache = IndexCache(tmp_path)
    cache.store("k" * 32, RecordIndex(100, np.array([0, 50, 100], np.int64), False, STAMP))
    assert cache.load("k" * 32, SourceStamp(100, 6, 7, 9)) is None  # what the entry says, not its name
    assert cache.load("k" * 32, STAMP) is not None
    assert cache.drop("k" * 32) and not cache.drop("k" * 32)
    assert cache.load("k" * 32, STAMP) is None


# --------------------------------------------------------------------------- files of every format


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(20):
            for ext in ("txt", "cls"):
                data = b"%d" % i * (i + 1)
                info = tarfile.TarInfo(f"k{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.arange(90, dtype=np.int16).reshape(30, 3))
    return out.getvalue()


FILES = {
    "a.jsonl": ("lines", {}, b"".join(b'{"i": %d, "t": "%s"}\n' % (i, b"x" * (i % 9)) for i in range(40))),
    "b.txt": ("lines", {}, b"".join(b"l%d\n" % i for i in range(30)) + b"tail"),
    "c.csv": ("csv", {}, b'a,b\n' + b"".join(b'%d,"q\n%d"\n' % (i, i) if i % 2 else b"%d,p\n" % i for i in range(30))),
    "d.npy": ("npy", {}, _npy()),
    "e.bin": ("fixed", {"record_size": 8, "header_bytes": 4}, b"HEAD" + bytes(range(8)) * 25),
    "f.tfrecord": ("tfrecord", {}, b"".join(encode_frame(b"f%d" % i * (i % 5 + 1)) for i in range(30))),
    "g.tar": ("tar", {}, _tar()),
}


def _scan(tmp_path: Path, name: str):
    fmt_name, params, data = FILES[name]
    path = tmp_path / name
    path.write_bytes(data)
    fmt = make_format(fmt_name, params)
    return path, fmt, fmt.scan(np.frombuffer(data, np.uint8), str(path))


def _shifted(index: RecordIndex, how: str) -> RecordIndex:
    b = index.bounds.copy()
    if how == "inner":
        b[1:-1] += 1
    elif how == "first":
        b[0] += 1
    elif how == "blocks":
        b[1:-1] += 512
    elif how == "newline flag":
        return RecordIndex(index.size, b, not index.add_newline and index.n > 0)
    return RecordIndex(index.size, b, index.add_newline)


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_scanned_index_passes_its_checks(tmp_path, name):
    path, fmt, index = _scan(tmp_path, name)
    check_file_index(path, fmt, index)
    check = gather_check(fmt, "frames")
    ids = np.random.default_rng(0).permutation(index.n)
    window = assemble(index, ids, lambda s, e: _runs(path, s, e))
    if check is not None:
        check(window, ids, index, str(path))


def _runs(path: Path, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    data = np.frombuffer(path.read_bytes(), np.uint8)
    return np.concatenate([data[s:e] for s, e in zip(starts.tolist(), ends.tolist())] or [np.zeros(0, np.uint8)])


@pytest.mark.parametrize("name, how", [
    ("a.jsonl", "first"), ("b.txt", "newline flag"), ("c.csv", "first"), ("d.npy", "inner"), ("d.npy", "first"),
    ("e.bin", "inner"), ("e.bin", "first"), ("f.tfrecord", "first"), ("g.tar", "inner"), ("g.tar", "first"),
])
def test_check_index_refuses_bounds_that_cannot_be_the_file(tmp_path, name, how):
    path, fmt, index = _scan(tmp_path, name)
    with pytest.raises(FramingError):
        check_file_index(path, fmt, _shifted(index, how))


@pytest.mark.parametrize("name, how", [
    ("a.jsonl", "inner"), ("b.txt", "inner"), ("c.csv", "inner"), ("f.tfrecord", "inner"), ("g.tar", "blocks"),
])
def test_windows_over_shifted_bounds_fail_their_framing_check(tmp_path, name, how):
    """Holds: SEMANTICS.md#changes-cache"""
    path, fmt, index = _scan(tmp_path, name)
    bad = _shifted(index, how)
    check = gather_check(fmt, "index")
    ids = np.random.default_rng(1).permutation(bad.n)
    window = assemble(bad, ids, lambda s, e: _runs(path, s, e))
    with pytest.raises(FramingError) as e:
        check(window, ids, bad, str(path))
    assert e.value.path == str(path) and e.value.offset is not None


def test_csv_rows_split_inside_quotes_are_caught_by_their_quote_count(tmp_path):
    path, fmt, index = _scan(tmp_path, "c.csv")
    data = path.read_bytes()
    # a bound at the newline inside a quoted field: both halves end in a newline
    inside = data.index(b'"q\n') + 3
    b = np.sort(np.append(index.bounds, inside))
    bad = RecordIndex(index.size, b)
    ids = np.arange(bad.n)
    window = assemble(bad, ids, lambda s, e: _runs(path, s, e))
    check_lines(window, ids, bad, str(path))  # every record ends in a newline...
    with pytest.raises(FramingError, match="quoted"):
        check_rows(window, ids, bad, str(path))  # ...but one ends inside quotes


def test_a_pool_member_whose_last_line_lacks_its_newline_passes_and_a_wrong_flag_fails():
    a = RecordIndex(6, np.array([0, 2, 6], np.int64), True)  # "x\nyyyy" (no final newline)
    b = RecordIndex(4, np.array([0, 2, 4], np.int64), False)  # "z\nw\n"
    pool = PooledIndex([a, b]).torn_last()  # the torn "yyyy" is given last
    data = {0: b"x\n", 1: b"z\n", 2: b"w\n", 3: b"yyyy"}
    ids = np.array([2, 0, 1, 3])
    window = np.frombuffer(b"".join(data[i] for i in ids.tolist()), np.uint8)
    check_lines(window, ids, pool, "pool")
    # a member that does end in a newline ("p\nq\n"), flagged as lacking it: its torn line ends in one
    wrong = PooledIndex([RecordIndex(4, np.array([0, 2, 4], np.int64), True), b]).torn_last()
    with pytest.raises(FramingError):
        check_lines(np.frombuffer(b"z\n" + b"q\n", np.uint8), np.array([1, 3]), wrong, "pool")


def test_tfrecord_lengths_are_framing_crcs_are_the_full_check(tmp_path):
    path, fmt, index = _scan(tmp_path, "f.tfrecord")
    framing, full = gather_check(fmt, "index"), gather_check(fmt, "frames")
    assert (framing.kind, framing.full, full.kind, full.full) == ("tfrecord", None, "tfrecord", check_frames)
    ids = np.arange(index.n)
    window = assemble(index, ids, lambda s, e: _runs(path, s, e)).copy()
    window[14] ^= 1  # a payload byte: not framing
    check_lengths(window, ids, index, "f")
    with pytest.raises(FramingError, match="checksum"):
        check_frames(window, ids, index, "f")


def test_framing_checks_can_be_switched_off_only_by_the_environment(monkeypatch):
    fmt = make_format("lines", {})
    assert gather_check(fmt, "index").kind == gather_check(fmt, "frames").kind == "lines"
    assert gather_check(make_format("csv", {}), "frames").kind == gather_check(make_format("csv", {}), "index").kind \
        == "rows"
    assert gather_check(make_format("tar", {}), "index").kind == "tar"
    assert gather_check(make_format("npy", {}), "frames") is None  # checked on load, arithmetic
    monkeypatch.setenv(FRAMING_ENV, "off")
    assert gather_check(fmt, "frames") is None


def test_a_consistent_entry_that_does_not_fit_the_file_is_dropped_and_rebuilt(tmp_path):
    path, fmt, index = _scan(tmp_path, "d.npy")
    cache = IndexCache(tmp_path / "cache")
    first = load_or_build_index(path, fmt, cache)
    stamp = SourceStamp.of(os.stat(path))
    key = cache_key(path, stamp, fmt.name, fmt.params())
    cache.store(key, RecordIndex(first.size, first.bounds + np.int64(1) * (np.arange(first.n + 1) > 0)
                                 - (np.arange(first.n + 1) == first.n), False, stamp))
    again = load_or_build_index(path, fmt, cache)
    assert again.bounds.tolist() == first.bounds.tolist()
    assert cache.load(key, stamp).bounds.tolist() == first.bounds.tolist()  # written again


def test_the_fast_tar_header_check_agrees_with_the_scans():
    from shufflefs.formats.tar import _candidates, _valid_headers

    blocks = np.frombuffer(_tar(), np.uint8).reshape(-1, 512)
    rows = np.ascontiguousarray(np.concatenate([blocks, blocks[::2]]))
    rows[1::5, 7] ^= 0x40  # some headers and data blocks damaged
    signed = rows[0].copy()  # an old writer's checksum over signed bytes (a name byte >= 0x80)
    signed[5] = 0xE9
    s = int(signed.view(np.int8).sum()) - int(signed[148:156].view(np.int8).sum()) + 8 * 0x20
    signed[148:156] = np.frombuffer(b"%06o\0 " % s, np.uint8)
    rows = np.vstack([rows, signed])
    good, _ = _candidates(rows)
    want = np.zeros(len(rows), bool)
    want[good] = True
    assert want[-1] and want.sum() > 10 and (~want).sum() > 10
    assert (_valid_headers(rows) == want).all()
