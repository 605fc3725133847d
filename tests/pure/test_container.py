"""Level: pure (no mount, no daemon).

A compressed view's container (`windows.container`): every read of it, at any offset and length,
is the same bytes as the whole view, built only from the plain bytes `plain_range` names; the
whole view decodes to the plain view with the codecs' own readers; its size follows from the plain
size alone."""

from __future__ import annotations

import gzip
import io
import random

import pytest
import zstandard

from shufflefs.windows.container import CONTAINERS, GZIP_UNIT, ZSTD_UNIT, GzipMembers, ZstdRawFrame

SIZES = [0, 1, 2, 100, GZIP_UNIT - 1, GZIP_UNIT, GZIP_UNIT + 1, ZSTD_UNIT, ZSTD_UNIT + 1, 3 * ZSTD_UNIT + 17]


def _whole(c, plain: bytes) -> bytes:
    return bytes(c.render(0, c.size(len(plain)) + 10, len(plain), 0, plain))


def _decoded(c, data: bytes) -> bytes:
    if c.name == "gzip":
        return gzip.decompress(data)
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as r:
        return r.read()


@pytest.mark.parametrize("c", [GzipMembers(), ZstdRawFrame()], ids=lambda c: c.name)
@pytest.mark.parametrize("n", SIZES)
def test_the_view_decodes_to_the_plain_view(c, n: int) -> None:
    plain = random.Random(n).randbytes(n)
    whole = _whole(c, plain)
    assert len(whole) == c.size(n)
    assert _decoded(c, whole) == plain
    if n and c.name == "zstd":  # the frame says its content size: one-shot decoders use it
        assert zstandard.ZstdDecompressor().decompress(whole) == plain


@pytest.mark.parametrize("c", [GzipMembers(), ZstdRawFrame()], ids=lambda c: c.name)
def test_every_read_is_the_views_bytes_from_the_plain_bytes_it_names(c) -> None:
    rnd = random.Random(7)
    for n in SIZES:
        plain = rnd.randbytes(n)
        whole = _whole(c, plain)
        for _ in range(200):
            off, size = rnd.randrange(len(whole) + 5), rnd.choice([1, 7, 4096, 65558, 131072, 1 << 20])
            lo, hi = c.plain_range(off, size, n)
            assert 0 <= lo <= hi <= n
            # only the named plain bytes are given: anything else would raise or differ
            assert bytes(c.render(off, size, n, lo, plain[lo:hi])) == whole[off: off + size]


def test_sizes_follow_from_the_plain_size() -> None:
    g, z = CONTAINERS["gzip"], CONTAINERS["zstd"]
    assert g.size(0) == z.size(0) == 0
    assert g.size(1) == 1 + 23 and g.size(GZIP_UNIT) == GZIP_UNIT + 23 and g.size(GZIP_UNIT + 1) == GZIP_UNIT + 1 + 46
    assert z.size(1) == 14 + 1 + 3 and z.size(2 * ZSTD_UNIT) == 14 + 2 * ZSTD_UNIT + 6
    assert g.size(1 << 30) - (1 << 30) == 23 * -(-(1 << 30) // GZIP_UNIT)  # 0.035%


def test_a_gzip_members_crc_covers_its_bytes() -> None:
    plain = bytes(range(256)) * 600
    whole = bytearray(_whole(GzipMembers(), plain))
    whole[30] ^= 1  # a data byte of the first member: its CRC no longer holds
    with pytest.raises(gzip.BadGzipFile, match="CRC"):
        gzip.decompress(bytes(whole))


@pytest.mark.parametrize("step", [4096, 100_000, 131072, 1 << 20])
def test_a_sequential_reader_never_needs_plain_bytes_before_its_read(step: int) -> None:
    """With a memo of the checksums of the units reads leave unfinished, every read of a
    sequential reader needs only plain bytes from where it starts (a window boundary is never
    crossed backwards to finish a gzip member's CRC), and still gets the view's bytes."""
    c = GzipMembers()
    plain = random.Random(step).randbytes(700_001)
    whole = _whole(c, plain)
    memo: dict = {}
    off = 0

    def shown_before(at: int) -> int:  # plain bytes the view shows before byte ``at``
        u, r = divmod(at, GZIP_UNIT + 23)
        return u * GZIP_UNIT + min(max(r - 15, 0), GZIP_UNIT)

    while off < len(whole):
        lo, hi = c.plain_range(off, step, len(plain), memo)
        assert lo >= min(shown_before(off), hi) or lo == hi
        assert bytes(c.render(off, step, len(plain), lo, plain[lo:hi], memo)) == whole[off: off + step]
        off += step
    rnd = random.Random(2)
    for _ in range(200):  # jumps: a memo of other places never gives other bytes
        off = rnd.randrange(len(whole))
        lo, hi = c.plain_range(off, step, len(plain), memo)
        assert bytes(c.render(off, step, len(plain), lo, plain[lo:hi], memo)) == whole[off: off + step]


def test_a_plan_whose_checksum_went_meanwhile_is_refused_not_served_wrong() -> None:
    c = GzipMembers()
    plain = random.Random(3).randbytes(200_000)
    whole = _whole(c, plain)
    memo: dict = {}
    c.render(0, 40_000, len(plain), 0, plain[:40_000], memo)  # leaves member 0 unfinished
    lo, hi = c.plain_range(40_000, 60_000, len(plain), memo)
    assert lo > 0  # planned from the memo
    memo.clear()  # other readers pushed it out meanwhile
    with pytest.raises(LookupError):
        c.render(40_000, 60_000, len(plain), lo, plain[lo:hi], memo)
    lo, hi = c.plain_range(40_000, 60_000, len(plain))
    assert bytes(c.render(40_000, 60_000, len(plain), lo, plain[lo:hi])) == whole[40_000:100_000]
