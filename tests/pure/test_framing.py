"""Level: pure (no mount).

Every record is checked whole as a window is gathered (`formats.framing`), on every path a
window is built by: the compiled gather reading runs (block orders, a cold source), copying from
a mapping (record orders, a warm source), the compiled check of a window built elsewhere (a
remote source), and numpy without the compiled module.  An index whose bounds all sit where a
record can end, but that merges or splits records (every second bound of a JSON-lines file
dropped, two tar samples as one, one sample cut in two, two TFRecord frames as one, CSV rows
merged), fails every one of them; the index a scan builds passes every one, also for lines
without a final newline, quoted newlines, directories, long names and pools."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shufflefs.formats import FramingError, make_format
from shufflefs.formats import framing
from shufflefs.formats.framing import gather_check
from shufflefs.formats.tfrecord import encode_frame
from shufflefs.index.table import RecordIndex, SourceStamp
from shufflefs.pools.joined_index import PooledIndex
from shufflefs.sources.pool import PoolSource
from shufflefs.sources.local import SourceFile
from shufflefs.windows import view
from shufflefs.windows.layout import assemble
from test_layout import FixedOrderPlan

pytestmark = pytest.mark.skipif(view._build_window is None, reason="compiled window build not built")

PATHS = ("runs", "mapped", "window", "numpy")
"""How a window is built and checked: `_gather.build_window` (preads), `_gather.gather_mapped`,
`_gather.check_window` over a window built by `layout.assemble`, the numpy fallback."""


def _tar(n: int = 40, first: int = 0, long_every: int = 7) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        d = tarfile.TarInfo("train/")
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for i in range(first, first + n):
            for ext, data in (("txt", b"sample %d " % i * (i % 5 + 1)), ("cls", b"%d" % (i % 3))):
                stem = f"train/{'deep/' * 30 if i % long_every == 3 else ''}s{i:05d}"  # long names: pax headers
                info = tarfile.TarInfo(f"{stem}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            if i % 11 == 5:  # a directory between samples: travels with the next one
                d = tarfile.TarInfo(f"train/d{i}/")
                d.type = tarfile.DIRTYPE
                t.addfile(d)
    return out.getvalue()


def _gnu_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for i in range(30):
            for ext in ("a.png", "json"):
                info = tarfile.TarInfo(f"{'x' * (120 if i % 4 == 1 else 3)}{i:04d}.{ext}")  # ././@LongLink
                info.size = i
                t.addfile(info, io.BytesIO(b"z" * i))
    return out.getvalue()


FILES = {
    "a.jsonl": ("lines", b"".join(json.dumps({"i": i, "t": "x" * (i % 17)}).encode() + b"\n" for i in range(300))),
    "b.txt": ("lines", b"".join(b"line %d\n" % i for i in range(200)) + b"torn last line"),
    "c.csv": ("csv", b"id,text\n" + b"".join(b'%d,"multi\nline ""%d"""\n' % (i, i) if i % 3 == 0 else b"%d,plain\n" % i
                                             for i in range(240))),
    "d.tfrecord": ("tfrecord", b"".join(encode_frame(b"frame %d " % i * (i % 6 + 1)) for i in range(200))),
    "e.tar": ("tar", _tar()),
    "f.tar": ("tar", _gnu_tar()),
}


def _file(tmp_path: Path, name: str, data: bytes | None = None) -> tuple[str, object, RecordIndex]:
    kind, body = FILES[name]
    path = tmp_path / name
    path.write_bytes(body if data is None else data)
    fmt = make_format(kind, {})
    index = fmt.scan(np.frombuffer(path.read_bytes(), np.uint8), str(path))
    return str(path), fmt, RecordIndex(index.size, index.bounds, index.add_newline, SourceStamp.of(os.stat(path)))


def _with(index: RecordIndex, bounds: np.ndarray) -> RecordIndex:
    return RecordIndex(index.size, np.asarray(bounds, np.int64), index.add_newline, index.stamp)


def merged(index: RecordIndex) -> RecordIndex:
    """Every second inner bound dropped: pairs of records as one."""
    b = index.bounds
    return _with(index, np.concatenate((b[:1], b[1:-1][1::2], b[-1:])))


def load(path: str, fmt, index: RecordIndex, how: str, order: np.ndarray, cuts: list[int], monkeypatch,
         source=None) -> bytes:
    """Every window of a plan of ``order`` cut at ``cuts``, built and checked the way ``how`` says."""
    plan = FixedOrderPlan(index, np.asarray(order, np.int64), cuts)
    check = gather_check(fmt, "index")
    if how in ("window", "numpy"):
        fetch = source.read_runs if source is not None else _reader(path)
        if how == "numpy":
            monkeypatch.setattr(framing, "_gather", None)
        return b"".join(assemble(index, plan.window(k), fetch).tobytes() if check is None else
                        _checked(assemble(index, plan.window(k), fetch), plan.window(k), index, path, check)
                        for k in range(plan.n_windows))
    monkeypatch.setattr(view, "MAP_RUN", 1 << 40 if how == "mapped" else 0)
    monkeypatch.setattr(view, "CACHED", 0.0 if how == "mapped" else 2.0)
    v = view.View(path, index, plan, source=source, frame=(b"", b"") if source is not None else None, check=check)
    try:
        out = b"".join(v.load_window(k)[0].tobytes() for k in range(plan.n_windows))
        if how == "mapped":
            assert v._members, "the mapped path was not taken"
        return out
    finally:
        v.close()


def _checked(window: np.ndarray, ids: np.ndarray, index: RecordIndex, path: str, check) -> bytes:
    check(window, ids, index, path)
    return window.tobytes()


def _reader(path: str):
    data = np.frombuffer(Path(path).read_bytes(), np.uint8)
    return lambda s, e: np.concatenate([data[a:b] for a, b in zip(s.tolist(), e.tolist())] or [data[:0]])


@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_the_index_a_scan_builds_passes_on_every_path(tmp_path, monkeypatch, name, how):
    path, fmt, index = _file(tmp_path, name)
    for seed, windows in ((0, 1), (1, 5), (2, index.n)):
        order = np.random.default_rng(seed).permutation(index.n)
        cuts = [index.n * w // windows for w in range(1, windows)]
        got = load(path, fmt, index, how, order, cuts, monkeypatch)
        assert len(got) == index.data_bytes
    assert load(path, fmt, index, how, np.arange(index.n), [], monkeypatch) \
        == Path(path).read_bytes()[index.header_end: index.trailer_start] + b"\n" * len(index.newline_ids)


@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("name", sorted(FILES))
def test_merged_records_fail_on_every_path(tmp_path, monkeypatch, name, how):
    """Holds: SEMANTICS.md#changes-framing"""
    path, fmt, index = _file(tmp_path, name)
    bad = merged(index)
    for windows in (1, 7):
        order = np.random.default_rng(windows).permutation(bad.n)
        with pytest.raises(FramingError) as e:
            load(path, fmt, bad, how, order, [bad.n * w // windows for w in range(1, windows)], monkeypatch)
        assert e.value.path == path and e.value.offset in bad.bounds.tolist()


def _split(data: bytes, index: RecordIndex, sample: int) -> int:
    """The offset of the second member of tar sample ``sample`` (a bound there cuts it in two)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        starts = [m.offset for m in t.getmembers() if m.isfile()]
    lo, hi = int(index.bounds[sample]), int(index.bounds[sample + 1])
    inside = [s for s in starts if lo < s < hi]
    return inside[0]


@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("name", ["e.tar", "f.tar"])
def test_a_tar_sample_cut_in_two_fails(tmp_path, monkeypatch, name, how):
    """Both halves are whole members with one key each: the check sees the next record's key.
    Holds: SEMANTICS.md#changes-framing"""
    path, fmt, index = _file(tmp_path, name)
    data = Path(path).read_bytes()
    cut = _split(data, index, 9)
    bad = _with(index, np.sort(np.append(index.bounds, cut)))
    first = int(np.searchsorted(bad.bounds, cut)) - 1  # the first half's record
    with pytest.raises(FramingError, match="same sample key") as e:  # both halves in one window
        load(path, fmt, bad, how, np.random.default_rng(0).permutation(bad.n), [], monkeypatch)
    assert e.value.offset == cut
    if how in ("runs", "mapped"):  # the first half alone: the gather reads the next record's header
        with pytest.raises(FramingError, match="same sample key"):
            load(path, fmt, bad, how, np.array([first]), [], monkeypatch)
        load(path, fmt, index, how, np.array([first]), [], monkeypatch)  # the real sample alone passes


def test_csv_rows_cut_at_a_quoted_newline_fail(tmp_path, monkeypatch):
    path, fmt, index = _file(tmp_path, "c.csv")
    data = Path(path).read_bytes()
    inside = data.index(b'"multi\n') + len(b'"multi\n')
    bad = _with(index, np.sort(np.append(index.bounds, inside)))
    for how in PATHS:
        with pytest.raises(FramingError):
            load(path, fmt, bad, how, np.arange(bad.n), [], monkeypatch)


def test_a_torn_last_line_must_have_no_newline_and_others_one(tmp_path, monkeypatch):
    path, fmt, index = _file(tmp_path, "b.txt")
    assert index.add_newline
    # the last two lines as one record that "lacks its newline": it holds one
    b = index.bounds
    bad = _with(index, np.concatenate((b[:-2], b[-1:])))
    for how in PATHS:
        with pytest.raises(FramingError):
            load(path, fmt, bad, how, np.arange(bad.n), [], monkeypatch)


@pytest.mark.parametrize("how", ["runs", "mapped", "window"])
def test_pool_members_are_separate_files_for_the_key_check(tmp_path, monkeypatch, how):
    """The last sample of one shard and the first of the next may share a key: not a cut sample."""
    a, b = _tar(10, 0), _tar(10, 9)  # sample 9 ends the first and starts the second
    FILES["p0.tar"], FILES["p1.tar"] = ("tar", a), ("tar", b)
    try:
        members = [_file(tmp_path, n)[2] for n in ("p0.tar", "p1.tar")]
    finally:
        del FILES["p0.tar"], FILES["p1.tar"]
    pool = PooledIndex(members)
    source = PoolSource([str(tmp_path / n) for n in ("p0.tar", "p1.tar")], pool, SourceFile)
    try:
        got = load(str(tmp_path), make_format("tar", {}), pool, how, np.arange(pool.n), [], monkeypatch, source)
    finally:
        source.close()
    assert len(got) == pool.data_bytes


def test_reasons_and_kinds_of_the_compiled_module():
    from shufflefs import _gather

    assert _gather.FRAMING_KINDS == ("", "lines", "rows", "tar", "tfrecord")
    assert _gather.FRAMING_REASONS[0] == "" and all(_gather.FRAMING_REASONS[1:])
    assert "same sample key" in _gather.FRAMING_REASONS[_gather.FRAMING_SPLIT]
