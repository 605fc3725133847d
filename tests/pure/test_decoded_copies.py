"""Level: pure (no FUSE).

What a background decoded copy decodes gzip with (`formats.compressed.inflate`: zlib, member after
member, checked), and when the disk has no room for one (`Decoding.room_for`): the file is then
read from restart points, and its view's info says why."""

from __future__ import annotations

import gzip
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from shufflefs.errors import FormatError, StaleSourceError
from shufflefs.index.decoded import DecodedIndex, Restarts
from shufflefs.index.table import SourceStamp
from shufflefs.stages import kept_copies
from shufflefs.formats.compressed import inflate
from shufflefs.stages.decoded import Decoding


def members() -> tuple[bytes, bytes]:
    parts = [os.urandom(3000) * 40, b"", b"x" * 2_000_000, b"tail\n"]
    return b"".join(gzip.compress(p) for p in parts), b"".join(parts)


def reader(blob: bytes):
    return lambda a, b: blob[a:b]


def test_inflate_decodes_every_member_as_gzip_does():
    """Holds: SEMANTICS.md#views-compressed-copy"""
    blob, plain = members()
    assert b"".join(inflate(reader(blob), len(blob), "f.gz")) == plain == gzip.decompress(blob)
    assert b"".join(inflate(reader(b""), 0, "empty.gz")) == b""


def test_inflate_refuses_a_damaged_or_truncated_stream():
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#errors-eio"""
    blob, _ = members()
    bad = bytearray(blob)
    bad[len(blob) // 3] ^= 0x40
    with pytest.raises(FormatError):
        b"".join(inflate(reader(bytes(bad)), len(bad), "bad.gz"))
    with pytest.raises(FormatError, match="truncated"):
        b"".join(inflate(reader(blob[:-7]), len(blob) - 7, "short.gz"))
    with pytest.raises(StaleSourceError):  # the file is shorter than its indexed size now
        b"".join(inflate(reader(blob), len(blob) + 100, "shrunk.gz"))


def test_no_room_means_no_copy_and_the_info_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    d = Decoding(None, tmp_path / "cache", tmp_path / "copies", "stratified")  # type: ignore[arg-type]
    monkeypatch.setattr(kept_copies, "FREE_KEPT", 0.0)  # the test's disk may be nearly full itself
    monkeypatch.setattr(kept_copies, "FREE_KEPT_BYTES", 0)
    assert d.background and d.room_for(1 << 20) is None
    monkeypatch.setattr(kept_copies, "FREE_KEPT_BYTES", 1 << 62)
    why = d.room_for(1 << 20)
    assert why is not None and "free" in why
    restarts = Restarts("gzip", np.array([0, 1 << 20, 2 << 20], np.int64), np.zeros(0, np.int64),
                        np.zeros(0, np.int64), np.zeros(0, np.uint8))
    stamp = SourceStamp(1, 2, 3, 4)
    index = DecodedIndex(2 << 20, np.array([0, 2 << 20], np.int64), False, stamp, restarts)
    d._start("f.jsonl.gz", "/src/f.jsonl.gz", stamp, restarts)  # queued: the copying thread finds no room
    deadline = time.monotonic() + 30
    while d.describe()["queued"] or d.describe()["being_made"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    info = d.describe_view(index, "/src/f.jsonl.gz")
    assert info["read_from"] == "restart points" and info["decoded_copy"].startswith("none: "), info
    def unnumbered(why: str) -> str:  # the disk's free bytes it names move with other writers
        return re.sub(r"'s [\d,]+ free bytes$", "'s free bytes", why)

    refused = d.describe()["refused"]
    assert {p: unnumbered(w) for p, w in refused.items()} == {"/src/f.jsonl.gz": unnumbered(d.room_for(2 << 20))}
    d.close()


def test_needed_and_record_orders_make_no_background_copies(tmp_path: Path):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    assert not Decoding(None, tmp_path, tmp_path, "stratified", "needed").background  # type: ignore[arg-type]
    assert not Decoding(None, tmp_path, tmp_path, "full").background  # type: ignore[arg-type]  # copies every file anyway
    with pytest.raises(ValueError):
        Decoding(None, tmp_path, tmp_path, "stratified", "always")  # type: ignore[arg-type]


def test_a_scan_writes_the_copy_unless_the_disk_would_keep_too_little(tmp_path: Path):
    """The scan that indexes a compressed file writes its decoded bytes to the copy it is given,
    and stops writing (its partial file removed) where the disk would keep less than asked; the
    index is the same either way.  Holds: SEMANTICS.md#views-compressed-copy"""
    from shufflefs.formats.compressed import CopyTarget, CopyWriter, scan_decoded

    plain = b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * (i % 300)) for i in range(60000))
    blob = np.frombuffer(gzip.compress(plain), np.uint8)
    alone = scan_decoded("gzip", blob, "f.gz", 0, False)
    target = CopyTarget(str(tmp_path / "copy"), keep_free=0)
    copied = scan_decoded("gzip", blob, "f.gz", 0, False, copy=target)
    assert Path(target.path).read_bytes() == plain
    assert np.array_equal(copied.bounds, alone.bounds) and copied.size == alone.size
    old = CopyWriter.CHECK_EVERY
    CopyWriter.CHECK_EVERY = 1 << 20  # look at the free space every MiB: the file is ~10 MB
    try:
        full = CopyTarget(str(tmp_path / "no-room"), keep_free=1 << 62)
        again = scan_decoded("gzip", blob, "f.gz", 0, False, copy=full)
    finally:
        CopyWriter.CHECK_EVERY = old
    assert not os.path.exists(full.path) and np.array_equal(again.bounds, alone.bounds)
