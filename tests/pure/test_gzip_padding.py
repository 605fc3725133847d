"""Level: pure (no mount, no daemon).

The ends of gzip streams (`formats.gzip_edges`, `formats.codecs`): zero bytes after the last
member (padding, which `gzip` and Python's `gzip` skip) are skipped, every member before them
still decoded and checked; a stream cut short anywhere, also inside its deflate data (where
rapidgzip 0.16 may stop without an error), or damaged, is a `FormatError`, never fewer bytes."""

from __future__ import annotations

import gzip
import io
import os
import random
from pathlib import Path

import pytest

from shufflefs.errors import FormatError
from shufflefs.formats import codecs, resolve_format, scan_file
from shufflefs.formats.codecs import DecodedReader
from shufflefs.formats.compressed import inflate
from shufflefs.formats.gzip_edges import TOLERATED

rapidgzip = pytest.importorskip("rapidgzip")


def jsonl(n: int, seed: int = 0) -> bytes:
    rnd = random.Random(seed)
    return b"".join(b'{"id": %d, "t": "%s"}\n' % (i, bytes(rnd.choice(b"abcdefgh") for _ in range(i % 60)))
                    for i in range(n))


DATA = jsonl(60_000)
FILES = {
    "one member": gzip.compress(DATA),
    "three members": b"".join(gzip.compress(DATA[i::3]) for i in range(3)),
    "an empty last member": gzip.compress(DATA) + gzip.compress(b""),
    "only an empty member": gzip.compress(b""),
    "a last member of 200 bytes": gzip.compress(DATA) + gzip.compress(DATA[:200]),
    "a last member of 65,536 bytes": gzip.compress(DATA[:65536]),
    "three bytes": gzip.compress(b"a\n\n"),
}
PADS = (0, 1, TOLERATED, TOLERATED + 1, 8, 9, 511, 4096, 1 << 20)


def decode(raw: bytes) -> tuple[bytes, codecs.Restarts]:
    steps, restarts = codecs.decode_all("gzip", *codecs.buffer_read(raw), "x.jsonl.gz")
    return b"".join(bytes(s) for s in steps), restarts()


def test_rapidgzip_reads_past_as_many_zeros_as_the_padding_rule_says():
    """`stream_end` leaves up to `TOLERATED` zero bytes after the last member for rapidgzip to read
    past; a rapidgzip that reads past fewer (or fails on more no longer) shows here first."""
    raw = gzip.compress(DATA)
    for pad in range(TOLERATED + 1):
        with rapidgzip.RapidgzipFile(io.BytesIO(raw + bytes(pad)), parallelization=1) as f:
            assert f.read() == DATA
    with pytest.raises((ValueError, RuntimeError)):
        with rapidgzip.RapidgzipFile(io.BytesIO(raw + bytes(TOLERATED + 1)), parallelization=1) as f:
            f.read()


@pytest.mark.parametrize("name", FILES)
def test_zero_padding_after_the_last_member_is_skipped(name: str):
    """Holds: SEMANTICS.md#views-compressed"""
    raw = FILES[name]
    want = gzip.decompress(raw)
    for pad in PADS:
        got, restarts = decode(raw + bytes(pad))
        assert got == want, (name, pad)
        assert gzip.decompress(raw + bytes(pad)) == want  # what Python's gzip reads
        end = restarts.end(len(raw) + pad)
        assert len(raw) <= end <= len(raw) + pad and (pad < 16 or end <= len(raw) + TOLERATED)
        # the child's zlib decoder (a copy made in the background), given the stream's end, reads the same
        padded = raw + bytes(pad)
        assert b"".join(inflate(lambda a, b: padded[a:b], end, "x.gz")) == want


def test_a_stream_cut_anywhere_is_an_error_padded_or_not():
    """rapidgzip 0.16 ends a stream cut inside its deflate data without an error, with the bytes
    before the cut: the scan checks that decoding reached the stream's end.
    Holds: SEMANTICS.md#views-compressed, SEMANTICS.md#errors-eio"""
    for name in ("one member", "three members"):
        raw = FILES[name]
        for cut in [1, 8, 9, 10, 100] + list(range(1000, len(raw) - 20, len(raw) // 40)):
            for pad in (0, 4096):
                if pad and not raw[len(raw) - cut:].strip(b"\0"):
                    continue  # the padding gives back the zeros cut: the same bytes as a whole stream padded
                with pytest.raises(FormatError, match="gzip stream"):
                    decode(raw[: len(raw) - cut] + bytes(pad))


@pytest.mark.parametrize("where", ["trailer", "data"])
def test_a_damaged_member_before_padding_is_an_error(where: str):
    """Holds: SEMANTICS.md#views-compressed"""
    raw = bytearray(FILES["three members"])
    raw[-6 if where == "trailer" else len(raw) // 2] ^= 0x10
    with pytest.raises(FormatError):
        decode(bytes(raw) + bytes(4096))


def test_a_padded_file_reads_back_from_its_restart_points(tmp_path: Path):
    """A padded file's decoded bytes read from anywhere, its last ones too, through the file's own
    descriptor as views read it.  Holds: SEMANTICS.md#views-compressed"""
    raw = FILES["three members"] + bytes(70_000)
    src = tmp_path / "p.jsonl.gz"
    src.write_bytes(raw)
    index = scan_file(src, resolve_format(src.name, ()))
    whole = len(FILES["three members"])
    assert index.size == len(DATA) and whole <= index.restarts.end(len(raw)) <= whole + TOLERATED
    plain = gzip.decompress(raw)
    fd = os.open(src, os.O_RDONLY)
    try:
        reader = DecodedReader(index.restarts, lambda a, b: os.pread(fd, b - a, a), len(raw), str(src), fd=fd)
        try:
            for start, n in ((len(plain) - 5000, 5000), (0, 3000), (len(plain) // 2, 100_000), (len(plain) - 1, 1)):
                assert reader(start, start + n) == plain[start: start + n]
        finally:
            reader.close()
    finally:
        os.close(fd)


def test_zeros_between_members_are_still_refused_with_the_padding_named():
    """Only zeros at the end are padding; zeros then another member is a stream the decoder cannot
    read, and the error says what the file ends in only when it ends in zeros."""
    raw = gzip.compress(DATA) + bytes(100) + gzip.compress(DATA[:1000])
    with pytest.raises(FormatError) as e:
        decode(raw)
    assert "padding" not in str(e.value)
    with pytest.raises(FormatError, match=r"ends in 10\d zero bytes, taken as padding"):
        decode(raw + bytes(100))


def test_a_cached_gzip_index_is_taken_only_if_its_stream_end_was_checked(tmp_path: Path, monkeypatch):
    """An index cached before decoding was checked to reach the stream's end may be of a file cut
    short, and one whose end lies outside the file cannot be the file's: both are scanned again."""
    from shufflefs.formats import load_or_build_index
    from shufflefs.index.decoded import DecodedIndex
    from shufflefs.index.table import IndexCache, SourceStamp, cache_key

    src = tmp_path / "p.jsonl.gz"
    src.write_bytes(FILES["one member"] + bytes(1000))
    fmt = resolve_format(src.name, ())
    cache = IndexCache(tmp_path / "cache")
    built = load_or_build_index(src, fmt, cache)
    stamp = SourceStamp.of(src.stat())
    key = cache_key(src, stamp, fmt.name, fmt.params())
    assert cache.load(key, stamp) is not None
    arrays = built.cache_arrays()
    for forged in ({k: v for k, v in arrays.items() if k != "ends_checked"},
                   {**arrays, "packed_end": arrays["packed_end"] * 0 + stamp.size + 1}):
        monkeypatch.setattr(DecodedIndex, "cache_arrays", lambda self, forged=forged: forged)
        cache.store(key, built)
        assert cache.load(key, stamp) is None
    monkeypatch.undo()
    cache.store(key, built)
    again = cache.load(key, stamp)
    assert again is not None and again.restarts.end(stamp.size) == built.restarts.end(stamp.size) < stamp.size
