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
from shufflefs.formats import framing, tar_walk
from shufflefs.formats.framing import gather_check
from shufflefs.formats.tfrecord import encode_frame
from shufflefs.index.table import RecordIndex, SourceStamp
from shufflefs.index.joined_index import PooledIndex, SegmentIndex
from shufflefs.sources.pool import PoolSource
from shufflefs.sources.local import SourceFile
from shufflefs.stages.stage_file import StagedSource, write_stage
from shufflefs.windows import edges, view
from shufflefs.windows.layout import assemble
from test_layout import FixedOrderPlan

pytestmark = pytest.mark.skipif(view._build_window is None, reason="compiled window build not built")

BLOCK = 512
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


class Undescribed(SourceFile):
    """A local file read as object storage is: no descriptors, windows from `read_runs` (each
    call counted in ``calls``)."""

    calls: list = []

    def place(self, index, first, count):
        return None

    def read_runs(self, starts, ends, out=None):
        self.calls.append(int((np.asarray(ends) - starts).sum()))
        return super().read_runs(starts, ends, out)


def load(path: str, fmt, index: RecordIndex, how: str, order: np.ndarray, cuts: list[int], monkeypatch,
         source=None) -> bytes:
    """Every window of a plan of ``order`` cut at ``cuts``, built and checked the way ``how`` says
    (``window`` and ``numpy``: from `Source.read_runs` of a source without descriptors, as of
    object storage; ``source``: a pool's, of such members for those)."""
    plan = FixedOrderPlan(index, np.asarray(order, np.int64), cuts)
    check = gather_check(fmt, "index")
    if how in ("window", "numpy"):
        if how == "numpy":
            monkeypatch.setattr(framing, "_gather", None)
        if check is not None and check.kind != "tar":  # the window alone, without a view
            fetch = source.read_runs if source is not None else _reader(path)
            return b"".join(_checked(assemble(index, plan.window(k), fetch), plan.window(k), index, path, check)
                            for k in range(plan.n_windows))
        own = source is None
        source = Undescribed(path, index.stamp) if own else source
        v = view.View(path, index, plan, source=source, frame=(b"", b""), check=check)
        assert not v._gathered
        try:
            return b"".join(v.load_window(k)[0].tobytes() for k in range(plan.n_windows))
        finally:
            if own:
                v.close()
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
def test_a_tar_sample_cut_in_two_fails_whichever_half_a_window_holds(tmp_path, monkeypatch, name, how):
    """Both halves are whole members with one key each: each is checked against its neighbour in
    the file, read from the file whatever window (if any) holds it.
    Holds: SEMANTICS.md#changes-framing, SEMANTICS.md#changes-framing-tar"""
    path, fmt, index = _file(tmp_path, name)
    data = Path(path).read_bytes()
    for sample in (9, 10):  # 10 of e.tar: long names, each member behind a pax header
        cut = _split(data, index, sample)
        bad = _with(index, np.sort(np.append(index.bounds, cut)))
        first = int(np.searchsorted(bad.bounds, cut)) - 1  # the first half's record
        with pytest.raises(FramingError, match="same sample key") as e:  # both halves in one window
            load(path, fmt, bad, how, np.random.default_rng(0).permutation(bad.n), [], monkeypatch)
        assert e.value.offset in (cut, bad.bounds[first])
        others = np.setdiff1d(np.arange(bad.n), [first, first + 1])
        for alone in ([first], [first + 1], [first + 1, first]):  # every half in a window of its own
            order = np.concatenate((others[:5], alone, others[5:]))
            bad = _with(index, bad.bounds)  # nothing of it seen before (`edges.seen_of`)
            with pytest.raises(FramingError, match="same sample key") as e:
                load(path, fmt, bad, how, order, [5, 6, 7], monkeypatch)
            assert e.value.offset in (cut, bad.bounds[first]) and e.value.path == path
        load(path, fmt, index, how, np.array([first, first + 1]), [1], monkeypatch)  # the real samples pass


def _dir_between(data: bytes, index: RecordIndex) -> tuple[int, int]:
    """A sample that starts with a directory (no key: it travels with the sample after it), and
    the offset of its first keyed member."""
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        members = t.getmembers()
    for a, b in zip(members, members[1:]):
        if a.isdir() and a.offset in index.bounds[1:-1].tolist():
            return int(np.searchsorted(index.bounds, a.offset)), b.offset
    raise AssertionError("no directory between samples")


@pytest.mark.parametrize("how", PATHS)
def test_a_member_of_no_key_moved_to_the_sample_before_fails(tmp_path, monkeypatch, how):
    """A directory between two samples is the later one's: a bound after it (the directory with
    the sample before, as many records, each of one key) is wrong, as is a file's first sample
    starting with the directory that opens the file (the header's).
    Holds: SEMANTICS.md#changes-framing-tar"""
    path, fmt, index = _file(tmp_path, "e.tar")
    data = Path(path).read_bytes()
    rid, keyed = _dir_between(data, index)
    moved = index.bounds.copy()
    moved[rid] = keyed
    bad = _with(index, moved)
    assert bad.n == index.n
    for order in (np.arange(bad.n), [rid], [rid - 1], [rid, rid - 1]):
        with pytest.raises(FramingError, match="members of no sample key"):
            load(path, fmt, bad, how, np.asarray(order), [], monkeypatch)
    assert index.header_end == BLOCK  # "train/": the header
    head = _with(index, np.concatenate(([0], index.bounds[1:])))
    head = RecordIndex(head.size, head.bounds, False, index.stamp)
    with pytest.raises(FramingError, match="first sample starts with members of no sample key"):
        load(path, fmt, head, how, np.array([0]), [], monkeypatch)
    load(path, fmt, index, how, np.array([rid, rid - 1, 0]), [1, 2], monkeypatch)


@pytest.mark.parametrize("how", PATHS)
def test_a_cut_sample_at_the_end_of_a_stretch_of_its_file_fails(tmp_path, monkeypatch, how):
    """A mixture's stretch (a segment) of a file that ends with the first half of a cut sample,
    the second half in no stretch of the epoch: the half is checked against the file.
    Holds: SEMANTICS.md#changes-framing-tar"""
    path, fmt, index = _file(tmp_path, "e.tar")
    cut = _split(Path(path).read_bytes(), index, 9)
    bad = _with(index, np.sort(np.append(index.bounds, cut)))
    first = int(np.searchsorted(bad.bounds, cut)) - 1
    for forged, ends in ((bad, first + 1), (index, first)):
        base = PooledIndex([forged])
        seg = SegmentIndex(base, np.array([ends - 6, 20]), np.array([6, 5]))  # the stretch ends at the half
        source = PoolSource([path], seg, Undescribed if how in ("window", "numpy") else SourceFile)
        try:
            if forged is bad:
                with pytest.raises(FramingError, match="same sample key"):
                    load(path, fmt, seg, how, np.arange(seg.n)[::-1], [], monkeypatch, source)
            else:
                load(path, fmt, seg, how, np.arange(seg.n)[::-1], [], monkeypatch, source)
        finally:
            source.close()


def test_a_window_from_object_storage_fetches_the_neighbours_with_its_records(tmp_path, monkeypatch):
    """One `read_runs` per window (ranges the store coalesces) while the samples before runs are
    small; samples over `edges.PRED_WHOLE` are walked header by header, in more rounds.
    Holds: SEMANTICS.md#changes-framing-tar"""
    path, fmt, index = _file(tmp_path, "e.tar")
    calls = Undescribed.calls = []
    order = np.random.default_rng(3).permutation(index.n)
    load(path, fmt, index, "window", order, [10, 20, 30], monkeypatch)
    assert len(calls) == 4 and sum(calls) > index.data_bytes  # the neighbours came along
    calls = Undescribed.calls = []  # a second epoch: every neighbour was walked in the first
    load(path, fmt, index, "window", np.random.default_rng(4).permutation(index.n), [10, 20, 30], monkeypatch)
    assert len(calls) == 4 and sum(calls) == index.data_bytes
    cut = _split(Path(path).read_bytes(), index, 9)
    bad = _with(index, np.sort(np.append(index.bounds, cut)))
    first = int(np.searchsorted(bad.bounds, cut)) - 1
    load(path, fmt, bad, "window", np.array([first - 1, first + 2]), [1], monkeypatch)  # the halves' neighbours
    calls = Undescribed.calls = []
    with pytest.raises(FramingError, match="same sample key"):  # found in what the first window walked
        load(path, fmt, bad, "window", np.array([first]), [], monkeypatch)
    lengths = bad.record_lengths(np.array([first, first + 1])).tolist()
    assert calls == [lengths[0] + min(lengths[1], edges.HEAD)]  # the next header only
    big = b"".join(_member_bytes(f"b{i:03d}.{ext}", bytes([i]) * size) for i in range(8)
                   for ext, size in (("bin", 300_000), ("cls", 3))) + bytes(2 * BLOCK)
    FILES["g.tar"] = ("tar", big)
    try:
        path, fmt, index = _file(tmp_path, "g.tar")
    finally:
        del FILES["g.tar"]
    assert np.diff(index.bounds).min() > edges.PRED_WHOLE
    bad = _with(index, np.sort(np.append(index.bounds, _split(big, index, 4))))  # sample 4's cls alone
    calls = Undescribed.calls = []
    with pytest.raises(FramingError, match="same sample key"):
        load(path, fmt, bad, "window", np.array([5]), [], monkeypatch)
    assert len(calls) > 1
    load(path, fmt, index, "window", np.array([5, 2]), [1], monkeypatch)


@pytest.mark.parametrize("kind", [SourceFile, Undescribed])
def test_a_stage_holding_half_of_a_cut_sample_fails(tmp_path, kind):
    """A stage (``--stage-dir``) holds its records away from their neighbours: the half it holds
    is checked against its source file, local or (`Undescribed`) fetched as from object storage.
    Holds: SEMANTICS.md#changes-framing-tar"""
    path, fmt, index = _file(tmp_path, "e.tar")
    cut = _split(Path(path).read_bytes(), index, 9)
    bad = _with(index, np.sort(np.append(index.bounds, cut)))
    first = int(np.searchsorted(bad.bounds, cut)) - 1
    for forged, held in ((bad, np.setdiff1d(np.arange(bad.n), [first + 1])), (bad, np.arange(first + 1, bad.n)),
                         (index, np.setdiff1d(np.arange(index.n), [first + 1]))):
        source = kind(path, forged.stamp)
        stage = write_stage(str(tmp_path / "s.stage"), "e.tar", 0, forged, held, source)
        staged = StagedSource(source, stage, stage.drop)
        order = np.random.default_rng(1).permutation(held)
        v = view.View(path, forged, FixedOrderPlan(forged, order, [len(order) // 2]), source=staged,
                      frame=(b"", b""), check=gather_check(fmt, "index"))
        try:
            if forged is bad:
                with pytest.raises(FramingError, match="same sample key"):
                    for k in range(2):
                        v.load_window(k)
            else:
                assert sum(len(v.load_window(k)[0]) for k in range(2)) == int(index.record_lengths(held).sum())
        finally:
            v.close()


def _member_bytes(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % BLOCK)


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
    source = PoolSource([str(tmp_path / n) for n in ("p0.tar", "p1.tar")], pool,
                        Undescribed if how == "window" else SourceFile)
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
    assert set(tar_walk.REASONS.values()) <= set(_gather.FRAMING_REASONS)  # the fallback's words too
