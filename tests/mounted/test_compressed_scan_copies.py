"""Level: mounted (real FUSE mounts, real readers).

Decoded copies written by the index scan: the scan that indexes a compressed file decodes all of
it anyway, so under ``--decoded-copies auto`` (the default) it also writes the file's decoded copy,
and the file's first views read that copy instead of decoding from restart points (or, for one
zstd frame, instead of decoding the file a second time before the first byte).  The bytes a view
holds never depend on where they come from; a scan that fails leaves no copy behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import compressed_files as cf

FILES = {"train.jsonl.gz": lambda d: cf.gz(d, members=3), "frames.jsonl.zst": lambda d: cf.zst(d, frame=1 << 20),
         "one.jsonl.zst": lambda d: cf.zst(d)}


def info(m, name: str) -> dict:
    return json.loads(m.xattr("info", name))["compressed"]


@pytest.fixture(scope="module")
def plain() -> bytes:
    return cf.jsonl(12000, seed=5)


def test_the_index_scan_writes_the_copy_the_first_views_read(mount, plain: bytes):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#views-order"""
    files = {name: encode(plain) for name, encode in FILES.items()}
    auto = mount(files, "--seed", "4")
    needed = mount(files, "--seed", "4", "--decoded-copies", "needed")
    for name in files:
        got = info(auto, name)  # the lookup indexed the file: its copy is there before any open
        assert got["read_from"] == "a decoded copy", got
        if name != "one.jsonl.zst":
            assert "the scan that indexed the file" in got["copied_because"], got
        first = auto.path(name).read_bytes()
        assert first == needed.path(name).read_bytes()
        assert sorted(cf.lines_of(cf.decode(name, first))) == sorted(cf.lines_of(plain))
        for m in (auto, needed):
            m.set_epoch(1, name)
        assert auto.path(name).read_bytes() == needed.path(name).read_bytes() != first
    stats = auto.stats()
    assert stats["decoded"]["being_made"] == [] and stats["decoded"]["queued"] == []  # no second decode
    made = {Path(p).name: c["made"] for p, c in stats["decoded_copies"].items()}
    assert made == {name: "by the scan that indexed the file" for name in files}, made
    # `needed` copies only what has no restart points worth using, at its first open
    assert {Path(p).name for p in needed.stats().get("decoded_copies", {})} == {"one.jsonl.zst"}
    assert info(needed, "train.jsonl.gz")["read_from"] == "restart points"


def test_a_scan_that_fails_leaves_no_copy_and_the_error_names_the_file(mount, plain: bytes):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#errors-eio"""
    good = cf.gz(plain)
    bad = bytearray(good)
    bad[len(bad) // 2: len(bad) // 2 + 64] = bytes(64)  # a damaged deflate stream mid-file
    m = mount({"good.jsonl.gz": good, "bad.jsonl.gz": bytes(bad)})
    with pytest.raises(OSError):
        m.path("bad.jsonl.gz").read_bytes()
    assert "bad.jsonl.gz" in m.stderr()
    assert m.path("good.jsonl.gz").read_bytes()
    stats = m.stats()
    assert {Path(p).name for p in stats.get("decoded_copies", {})} == {"good.jsonl.gz"}
    left = sorted(p.name for p in m.cache.rglob("indexed-*"))
    assert len(left) == 1, left  # good's copy only: bad's partial copy was removed
