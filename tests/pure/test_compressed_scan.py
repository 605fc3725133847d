"""Level: pure (no mount, no daemon).

Compressed text (`formats.compressed`, `formats.codecs`, `index.decoded`): a gzip or zstd file's
index is the index of its decoded bytes, exactly as the plain line formats find it (header lines,
CSV quotes across decode steps, a last line without its newline), with restart points from
which any decoded range reads back the right bytes; it is cached keyed by the compressed file's
version with its restart points; a damaged stream is a `FormatError` naming the file, never
bytes; a codec whose library is missing leaves its files to pass through."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

from shufflefs.errors import FormatError
from shufflefs.formats import check_file_index, load_or_build_index, make_format, resolve_format, scan_file
from shufflefs.formats import codecs
from shufflefs.formats.codecs import DecodedReader
from shufflefs.index.decoded import DecodedIndex
from shufflefs.index.table import IndexCache


def jsonl(n: int, seed: int = 0, torn: bool = False) -> bytes:
    """``n`` JSON lines of 30-930 bytes of random letters (about 1.7x compressible)."""
    rnd = random.Random(seed)
    text = rnd.randbytes(n * 1000).translate(bytes(97 + i % 26 for i in range(256)))
    lines = b"".join(b'{"id": %d, "text": "%s"}\n' % (i, text[i * 1000: i * 1000 + rnd.randrange(0, 900)])
                     for i in range(n))
    return lines + (b'{"id": "torn"' if torn else b"")


def csv_rows(n: int) -> bytes:
    rows = [b"id,text\n"] + [b'%d,"a ""quoted""\nfield %d"\n' % (i, i) if i % 3 == 0 else b"%d,plain\n" % i
                              for i in range(n)]
    return b"".join(rows)


def zstd_frames(data: bytes, frame: int, skippable: bool = False) -> bytes:
    """Frames of ``frame`` decoded bytes each (as pzstd or the seekable format write them),
    then a skippable frame (a seek table's place) if asked."""
    c = zstandard.ZstdCompressor(level=3, write_checksum=True)
    out = b"".join(c.compress(data[i: i + frame]) for i in range(0, len(data), frame))
    return out + (b"\x5e\x2a\x4d\x18" + (9).to_bytes(4, "little") + bytes(9) if skippable else b"")


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def encodings(plain: bytes) -> dict[str, bytes]:
    return {
        "gz": gzip.compress(plain, 6),
        "gz-members": b"".join(gzip.compress(plain[i: i + 3_000_000]) for i in range(0, len(plain), 3_000_000)),
        "zst-one": zstandard.ZstdCompressor(write_checksum=True).compress(plain),  # as the zstd CLI writes
        "zst-frames": zstd_frames(plain, 1 << 18, skippable=True),
    }


@pytest.mark.parametrize("kind", ["gz", "gz-members", "zst-one", "zst-frames"])
@pytest.mark.parametrize("torn", [False, True])
def test_the_index_is_the_decoded_files_and_its_restarts_read_back(tmp_path: Path, kind: str, torn: bool,
                                                                   monkeypatch) -> None:
    monkeypatch.setattr(codecs, "DECODE_STEP", 100_003)  # many steps, cut anywhere
    plain = jsonl(12_000, torn=torn)  # 5.6 MB: one zstd frame of it is more than MAX_SPACING
    ext = "gz" if kind.startswith("gz") else "zst"
    src = write(tmp_path, f"a.jsonl.{ext}", encodings(plain)[kind])
    fmt = resolve_format(src.name, ())
    index = scan_file(src, fmt)
    want = scan_file(write(tmp_path, "a.jsonl", plain), resolve_format("a.jsonl", ()))
    assert isinstance(index, DecodedIndex) and index.stamp.size == src.stat().st_size
    assert index.size == len(plain) and np.array_equal(index.bounds, want.bounds)
    assert index.add_newline == torn
    assert index.staged == (kind == "zst-one")
    fd = os.open(src, os.O_RDONLY)
    reader = DecodedReader(index.restarts, lambda a, b: os.pread(fd, b - a, a), index.stamp.size, str(src))
    try:
        rnd = random.Random(1)
        for _ in range(40):
            a = rnd.randrange(len(plain))
            b = min(len(plain), a + rnd.choice([1, 1000, 300_000, 2_000_000]))
            assert reader(a, b) == plain[a:b]
    finally:
        reader.close()
        os.close(fd)


def test_csv_quotes_are_carried_across_decode_steps(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(codecs, "DECODE_STEP", 4099)
    plain = csv_rows(5000)
    want = scan_file(write(tmp_path, "a.csv", plain), make_format("csv"))
    for name, data in (("a.csv.gz", gzip.compress(plain)), ("a.csv.zst", zstd_frames(plain, 10_000))):
        got = scan_file(write(tmp_path, name, data), resolve_format(name, ()))
        assert got.header_end == want.header_end and np.array_equal(got.bounds, want.bounds), name


@pytest.mark.parametrize("name", ["a.csv.gz", "a.csv.zst"])
def test_a_csv_quote_left_open_is_refused(tmp_path: Path, name: str) -> None:
    plain = b'id,text\n1,"open\n2,x\n'
    data = gzip.compress(plain) if name.endswith("gz") else zstandard.ZstdCompressor().compress(plain)
    with pytest.raises(FormatError, match="unterminated quoted field"):
        scan_file(write(tmp_path, name, data), resolve_format(name, ()))


@pytest.mark.parametrize("kind", ["gz", "zst-frames", "zst-one"])
def test_a_damaged_stream_is_a_format_error_naming_the_file(tmp_path: Path, kind: str) -> None:
    data = bytearray(encodings(jsonl(3000))[kind])
    tail = 17 if kind == "zst-frames" else 0  # after the last frame: a skippable frame
    for at in (len(data) // 3, len(data) - tail - 3):  # a byte of the data, a byte of a checksum
        bad = bytearray(data)
        bad[at] ^= 0x55
        src = write(tmp_path, f"bad.jsonl.{'gz' if kind == 'gz' else 'zst'}", bytes(bad))
        with pytest.raises(FormatError) as e:
            scan_file(src, resolve_format(src.name, ()))
        assert str(src) in str(e.value)


def test_zstd_garbage_after_the_frames_is_refused(tmp_path: Path) -> None:
    src = write(tmp_path, "a.jsonl.zst", zstd_frames(jsonl(100), 4096) + b"trailing")
    with pytest.raises(FormatError, match="zstd"):
        scan_file(src, resolve_format(src.name, ()))


def test_cached_with_its_restart_points_and_checked_against_the_file(tmp_path: Path) -> None:
    plain = jsonl(4000)
    cache = IndexCache(tmp_path / "cache")
    for name, data in (("a.jsonl.gz", gzip.compress(plain)), ("b.jsonl.zst", zstd_frames(plain, 1 << 18))):
        src = write(tmp_path, name, data)
        fmt = resolve_format(name, ())
        built = load_or_build_index(src, fmt, cache)
        again = load_or_build_index(src, fmt, cache)
        assert isinstance(again, DecodedIndex) and again is not built
        assert np.array_equal(again.bounds, built.bounds) and again.size == len(plain)
        assert np.array_equal(again.restarts.plain, built.restarts.plain)
        assert np.array_equal(again.restarts.blob, built.restarts.blob)
        assert again.block_floor == built.block_floor > 0
        check_file_index(src, fmt, again)  # read through the decoded bytes


def test_a_changed_file_finds_no_cache_entry(tmp_path: Path) -> None:
    cache = IndexCache(tmp_path / "cache")
    src = write(tmp_path, "a.jsonl.gz", gzip.compress(jsonl(100)))
    fmt = resolve_format(src.name, ())
    first = load_or_build_index(src, fmt, cache)
    src.write_bytes(gzip.compress(jsonl(200)))
    second = load_or_build_index(src, fmt, cache)
    assert first.n == 100 and second.n == 200


def test_block_floor_spans_restart_intervals() -> None:
    from shufflefs.index.decoded import MAX_SPACING, Restarts

    none = np.zeros(0, np.int64)
    one = Restarts("zstd", np.array([0, 10 << 20], np.int64), none, none, np.zeros(0, np.uint8))
    assert not one.usable
    mib = Restarts("gzip", np.arange(0, 65, dtype=np.int64) << 20, none, none, np.zeros(0, np.uint8))
    assert mib.usable and mib.spacing == 1 << 20
    index = DecodedIndex(64 << 20, np.array([0, 64 << 20], np.int64), False, None, mib)
    assert index.block_floor == 1 << 20 and not index.staged
    far = Restarts("zstd", np.array([0, MAX_SPACING + 1, 2 * MAX_SPACING + 2], np.int64), none, none,
                   np.zeros(0, np.uint8))
    assert not far.usable


@pytest.mark.parametrize("relpath, name, params", [
    ("c4/en.00001-of-01024.json.gz", "lines-gzip", {"header_lines": 0}),
    ("x.JSONL.GZ", "lines-gzip", {"header_lines": 0}),
    ("x.txt.gz", "lines-gzip", {"header_lines": 0}),
    ("x.tsv.gz", "lines-gzip", {"header_lines": 1}),
    ("x.csv.gz", "csv-gzip", {"header_lines": 1}),
    ("pile/00.jsonl.zst", "lines-zstd", {"header_lines": 0}),
    ("x.json.zst", "lines-zstd", {"header_lines": 0}),
    ("x.csv.zst", "csv-zstd", {"header_lines": 1}),
    ("x.tar.gz", None, None),
    ("x.gz", None, None),
    ("x.json", None, None),
])
def test_resolved_by_their_last_two_suffixes(relpath: str, name, params) -> None:
    fmt = resolve_format(relpath, (), {})
    assert (fmt.name, fmt.params()) == (name, params) if name else fmt is None


def test_without_the_codecs_library_such_files_pass_through() -> None:
    code = ("import sys; sys.modules['rapidgzip'] = None\n"
            "from shufflefs.formats import resolve_format, parse_format_option\n"
            "assert resolve_format('a.jsonl.gz', ()) is None\n"
            "assert resolve_format('a.jsonl.zst', ()).name == 'lines-zstd'\n"
            "assert resolve_format('a.jsonl', ()).name == 'lines'\n"
            "try:\n    parse_format_option('*.dat=lines-gzip')\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pass through unchanged: rapidgzip is not installed" in r.stderr
    assert "need rapidgzip" in r.stdout


def test_decoders_beyond_the_bound_are_closed_and_made_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(codecs, "DECODERS_KEPT", 2)
    plain = jsonl(3000)
    src = write(tmp_path, "a.jsonl.gz", gzip.compress(plain))
    index = scan_file(src, resolve_format(src.name, ()))
    data = src.read_bytes()
    readers = [DecodedReader(index.restarts, lambda a, b: data[a:b], len(data), str(src)) for _ in range(4)]
    try:
        for r in readers:
            assert r(1000, 5000) == plain[1000:5000]
        assert [r.decoder is not None for r in readers] == [False, False, True, True]
        assert readers[0](7, 70_000) == plain[7:70_000]  # made again
    finally:
        for r in readers:
            r.close()


@pytest.mark.parametrize("kind", ["gz", "zst-frames"])
def test_window_loads_side_by_side_read_the_right_bytes(tmp_path: Path, kind: str) -> None:
    """Two threads reading one compressed source at once (two window loads) each get their
    bytes: every decoder reads the file by preads of its own descriptor."""
    import threading

    from shufflefs.index.table import SourceStamp
    from shufflefs.sources.decoded import DecodedSource
    from shufflefs.sources.local import SourceFile

    plain = jsonl(12_000)
    src = write(tmp_path, f"a.jsonl.{'gz' if kind == 'gz' else 'zst'}", encodings(plain)[kind])
    index = scan_file(src, resolve_format(src.name, ()))
    source = DecodedSource(SourceFile(str(src), SourceStamp.of(src.stat())), index.restarts, src.stat().st_size,
                           str(src))
    wrong: list = []

    def load(seed: int) -> None:
        rnd = np.random.default_rng(seed)
        for _ in range(40):
            starts = np.sort(rnd.integers(0, len(plain) - 300_000, 12))
            got = source.read_runs(starts, starts + 100_000).tobytes()
            want = b"".join(plain[s: s + 100_000] for s in starts.tolist())
            if got != want:
                wrong.append(seed)

    try:
        threads = [threading.Thread(target=load, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        source.close()
    assert not wrong


def test_decoders_of_one_file_do_not_share_a_file_offset(tmp_path: Path) -> None:
    """Two decoders of one file (two window loads) each go on with their own frame: they read by
    preads, so one's reads never move where the other's go on (a duplicated descriptor shares
    its offset: a stream taken up after the other decoder read elsewhere read the wrong bytes)."""
    from shufflefs.index.table import SourceStamp
    from shufflefs.sources.local import SourceFile

    plain = jsonl(20_000)  # frames of 4 MiB: a stream reads its frame's compressed bytes in steps
    src = write(tmp_path, "a.jsonl.zst", zstd_frames(plain, 4 << 20))
    index = scan_file(src, resolve_format(src.name, ()))
    raw = SourceFile(str(src), SourceStamp.of(src.stat()))
    a, b = (DecodedReader(index.restarts, raw.read_range, src.stat().st_size, str(src), fd=raw.fd) for _ in range(2))
    try:
        assert a(0, 100) == plain[:100]  # a: a stream of frame 0, its start read
        assert b(5 << 20, (5 << 20) + 100) == plain[5 << 20: (5 << 20) + 100]  # b: frame 1, elsewhere
        assert a(3 << 20, (3 << 20) + 1000) == plain[3 << 20: (3 << 20) + 1000]  # a goes on in frame 0
    finally:
        a.close()
        b.close()
        raw.close()


@pytest.mark.parametrize("content_size", [True, False])
def test_zstd_frames_read_whole_or_by_their_start_give_the_right_bytes(tmp_path: Path, content_size: bool) -> None:
    """A read needing most of a frame decodes it whole and keeps it (the next read of it copies
    from it); one needing a frame's first bytes decodes them as a stream: either way, in any
    order, the bytes of the decoded file, with or without content sizes in the frame headers."""
    plain = jsonl(3000)
    c = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=content_size)
    frame = 1 << 18
    src = write(tmp_path, "a.jsonl.zst", b"".join(c.compress(plain[i: i + frame]) for i in range(0, len(plain), frame)))
    index = scan_file(src, resolve_format(src.name, ()))
    assert index.restarts.points > 3
    data = src.read_bytes()
    reader = DecodedReader(index.restarts, lambda a, b: data[a:b], len(data), str(src))
    reads = [(frame + 10, 2 * frame - 5), (frame + 3, frame + 900), (2 * frame, 2 * frame + 100),  # whole, kept, start
             (2 * frame + 50, 3 * frame + 7), (3 * frame + 2, 3 * frame + 40), (0, len(plain))]
    rnd = random.Random(3)
    reads += [(a, min(len(plain), a + rnd.choice([10, 5000, frame // 2, frame, 3 * frame])))
              for a in (rnd.randrange(len(plain)) for _ in range(60))]
    try:
        for a, b in reads:
            assert reader(a, b) == plain[a:b], (a, b)
    finally:
        reader.close()


@pytest.mark.parametrize("whole,where", [(True, "middle"), (True, "checksum"), (False, "middle")])
def test_a_damaged_zstd_frame_read_whole_or_as_a_stream_is_a_format_error(tmp_path: Path, whole: bool,
                                                                          where: str) -> None:
    """A damaged frame, or one whose content checksum does not match, is an error naming the file."""
    plain = jsonl(3000)
    frame = 1 << 18
    c = zstandard.ZstdCompressor(level=3, write_checksum=True)
    frames = [c.compress(plain[i: i + frame]) for i in range(0, len(plain), frame)]
    bad = bytearray(frames[2])
    bad[len(bad) // 2 if where == "middle" else len(bad) - 2] ^= 0xFF
    data = b"".join(frames[:2]) + bytes(bad) + b"".join(frames[3:])
    clean = scan_file(write(tmp_path, "a.jsonl.zst", b"".join(frames)), resolve_format("a.jsonl.zst", ()))
    reader = DecodedReader(clean.restarts, lambda a, b: data[a:b], len(data), "a.jsonl.zst")
    try:
        a = 2 * frame + (10 if whole else 0)
        with pytest.raises(FormatError, match="a.jsonl.zst"):
            reader(a, 3 * frame if whole else a + frame // 2 + 1000)
        assert reader(frame, frame + 100) == plain[frame: frame + 100]  # the others still read
    finally:
        reader.close()


def test_sources_of_one_file_version_share_its_decoders(tmp_path: Path) -> None:
    """Sources of one file version (a view, a check of its header, the next epoch's view) share
    its decoders, one for gzip (loads side by side take turns), each reading through the source
    that took it; they outlive the last source, for the next; a changed file makes its own."""
    import threading

    from shufflefs.index.table import SourceStamp
    from shufflefs.sources import decoded
    from shufflefs.sources.local import SourceFile

    plain = jsonl(3000)
    src = write(tmp_path, "a.jsonl.gz", gzip.compress(plain))
    index = scan_file(src, resolve_format(src.name, ()))

    def source() -> decoded.DecodedSource:
        return decoded.DecodedSource(SourceFile(str(src), SourceStamp.of(src.stat())), index.restarts,
                                     src.stat().st_size, str(src))

    try:
        first, light = source(), source()
        assert first._decoders is light._decoders
        got: list = []
        threads = [threading.Thread(target=lambda s=s: got.append(s.read_range(100, 900_000) == plain[100:900_000]))
                   for s in (first, light, first, light)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [True] * 4 and first._decoders.made == decoded.DECODERS["gzip"] == 1
        made = first._decoders.free[0].decoder
        light.close()
        first.close()
        second = source()
        assert second.read_range(200_000, 300_000) == plain[200_000:300_000]
        reader = second._decoders.free[0]
        assert reader.decoder is made and reader.verify == second.raw.verify_open
        second.close()
        src.write_bytes(gzip.compress(plain[::-1]))
        os.utime(src, ns=(1, 1))
        index = scan_file(src, resolve_format(src.name, ()))
        third = source()
        assert third.read_range(0, 1000) == plain[::-1][:1000]
        assert third._decoders.free[0].decoder is not made
        third.close()
    finally:
        decoded.close_kept()



def test_a_gzip_decoder_calls_rapidgzip_on_its_own_thread_only(tmp_path: Path) -> None:
    """Reads from many threads (the daemon's window loads) reach rapidgzip from the decoder's own
    thread only: its allocator keeps a heap per calling thread (module docstring of codecs)."""
    import threading

    plain = jsonl(3000)
    src = write(tmp_path, "a.jsonl.gz", gzip.compress(plain))
    index = scan_file(src, resolve_format(src.name, ()))
    decoder = codecs.GzipDecoder(os.open(src, os.O_RDONLY), index.restarts)
    seen: set[int] = set()

    class Watched:
        def __init__(self, f) -> None:
            self.f = f

        def seek(self, at: int) -> int:
            seen.add(threading.get_ident())
            return self.f.seek(at)

        def readinto(self, out) -> int:
            seen.add(threading.get_ident())
            return self.f.readinto(out)

    decoder._f = Watched(decoder._f)
    callers, wrong = set(), []
    together = threading.Barrier(4)  # all alive at once: their idents are distinct

    def read(at: int) -> None:
        callers.add(threading.get_ident())
        together.wait()
        out = bytearray(50_000)
        decoder.read_runs([(at, memoryview(out))])
        if bytes(out) != plain[at: at + 50_000]:
            wrong.append(at)

    try:
        threads = [threading.Thread(target=read, args=(at,)) for at in (0, 400_000, 1_000_000, 7)]
        for t in threads:  # side by side: the decoder's thread takes them in turn
            t.start()
        for t in threads:
            t.join()
    finally:
        decoder._f = decoder._f.f
        decoder.close()
    assert not wrong and len(callers) == 4
    assert len(seen) == 1 and not seen & callers


@pytest.mark.parametrize("kind", ["gz", "zst-frames"])
def test_a_kept_decoder_reads_through_the_source_that_took_it(tmp_path: Path, kind: str) -> None:
    """A source without a descriptor (object storage) is read through by its decoders: one kept
    from a closed source reads through the next source, never through the closed one."""
    from shufflefs.index.table import SourceStamp
    from shufflefs.sources import decoded

    plain = jsonl(3000)
    src = write(tmp_path, f"a.jsonl.{'gz' if kind == 'gz' else 'zst'}", encodings(plain)[kind])
    index = scan_file(src, resolve_format(src.name, ()))
    data = src.read_bytes()

    class Remote:
        """A source read by ranges, refusing reads once closed."""

        stamp = SourceStamp.of(src.stat())

        def __init__(self) -> None:
            self.closed = False

        def read_range(self, a: int, b: int) -> bytes:
            assert not self.closed, "read through a closed source"
            return data[a:b]

        def verify_open(self) -> None:
            assert not self.closed

        def close(self) -> None:
            self.closed = True

    try:
        first = decoded.DecodedSource(Remote(), index.restarts, len(data), str(src))
        assert first.read_range(10, 300_000) == plain[10:300_000]
        first.close()
        second = decoded.DecodedSource(Remote(), index.restarts, len(data), str(src))
        assert second.read_range(600_000, 1_300_000) == plain[600_000:1_300_000]
        assert second._decoders is first._decoders
        second.close()
    finally:
        decoded.close_kept()


@pytest.mark.parametrize("name", ["e.jsonl.gz", "e.jsonl.zst", "e.csv.gz"])
def test_an_empty_stream_is_an_index_of_no_records(tmp_path: Path, name: str) -> None:
    """Holds: SEMANTICS.md#views-compressed"""
    raw = gzip.compress(b"") if name.endswith(".gz") else zstandard.ZstdCompressor().compress(b"")
    index = scan_file(write(tmp_path, name, raw), resolve_format(name, ()))
    assert isinstance(index, DecodedIndex) and index.n == 0 and index.size == 0


def test_a_file_named_gz_that_is_not_gzip_is_refused_not_served_empty(tmp_path: Path) -> None:
    """Plain lines under a ``.gz`` name decoded to no bytes, and were served as an empty view
    without a word.  Holds: SEMANTICS.md#views-compressed"""
    for name, data in (("plain.jsonl.gz", jsonl(50)), ("one-byte.jsonl.gz", b"\x1f")):
        with pytest.raises(FormatError, match="not a gzip stream"):
            scan_file(write(tmp_path, name, data), resolve_format(name, ()))
    assert scan_file(write(tmp_path, "zero.jsonl.gz", b""), resolve_format("zero.jsonl.gz", ())).n == 0
