"""Level: pure (no FUSE; real zstd frames).

A window's runs of a zstd file are filled last first, frames decoded straight into the window's
buffer, and the starts of frames kept so that a block's last record, which runs into the next
frame, does not decode that frame's start again (`formats.zstd_decode`).  Whatever the runs, the
bytes are the file's decoded bytes; the kept starts replace the second decodes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zstandard

from shufflefs.errors import FormatError
from shufflefs.formats import zstd_decode
from shufflefs.formats.codecs import DecodedReader, decode_all
from shufflefs.formats.zstd_decode import FrameHeads, ZstdDecoder
from shufflefs.index.table import SourceStamp
from shufflefs.stages.frame_fill import FrameFill

PLAIN = b"".join(b'{"i": %d, "text": "%s"}\n' % (i, b"xyz" * (i % 40)) for i in range(40000))
FRAME = 64 << 10


def frames_file(tmp_path: Path, plain: bytes = PLAIN, sizes: list[int] | None = None) -> tuple[Path, object]:
    """``plain`` in zstd frames of ``FRAME`` bytes (or of ``sizes``, zeros for empty frames)."""
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    cuts, at = [], 0
    for n in sizes or [FRAME] * (len(plain) // FRAME + 1):
        cuts.append((at, min(len(plain), at + n)))
        at = min(len(plain), at + n)
    assert at == len(plain)
    path = tmp_path / "f.jsonl.zst"
    path.write_bytes(b"".join(cctx.compress(plain[a:b]) for a, b in cuts))
    blob = path.read_bytes()
    steps, restarts = decode_all("zstd", lambda a, b: blob[a:b], len(blob), str(path))
    assert b"".join(bytes(s) for s in steps) == plain
    return path, restarts()


def reader_of(path: Path, restarts: object) -> tuple[DecodedReader, int]:
    fd = os.open(path, os.O_RDONLY)
    return DecodedReader(restarts, lambda a, b: os.pread(fd, b - a, a), path.stat().st_size, str(path), fd=fd), fd


def blocks(restarts: object, plain: bytes = PLAIN) -> tuple[np.ndarray, np.ndarray]:
    """The records that start in each frame, as the default blocks of a frames file are."""
    starts = np.concatenate(([0], np.flatnonzero(np.frombuffer(plain, np.uint8) == 10)[:-1] + 1))
    first = starts[np.minimum(np.searchsorted(starts, restarts.plain[:-1]), len(starts) - 1)]
    first = np.unique(first[restarts.plain[:-1] < len(plain)])
    return first, np.append(first[1:], len(plain))


def packed(reader: DecodedReader, starts: list[int], ends: list[int]) -> bytes:
    buf = bytearray(sum(e - s for s, e in zip(starts, ends)))
    reader.into_packed(memoryview(buf), starts, ends)
    return bytes(buf)


@pytest.mark.parametrize("sizes", [None, [5000, 0, 70000, 1, 0, 200000, 3] + [FRAME] * 30])
def test_packed_runs_are_the_decoded_bytes_whatever_the_runs(tmp_path: Path, sizes):
    plain = PLAIN if sizes is None else PLAIN[: sum(sizes[:-1]) + 3]
    path, restarts = frames_file(tmp_path, plain, sizes)
    reader, fd = reader_of(path, restarts)
    reader.heads = FrameHeads()
    rng = np.random.default_rng(3)
    try:
        for _ in range(200):  # disjoint ascending runs anywhere: mid-frame, across frames, tiny, at the end
            cuts = np.unique(rng.integers(0, len(plain) + 1, int(rng.integers(2, 24))))
            pairs = cuts[: len(cuts) // 2 * 2].reshape(-1, 2)
            pairs = pairs[pairs[:, 1] > pairs[:, 0]]
            starts, ends = pairs[:, 0].tolist(), pairs[:, 1].tolist()
            assert packed(reader, starts, ends) == b"".join(plain[a:b] for a, b in pairs)
        s, e = blocks(restarts, plain)
        for _ in range(3):  # whole blocks, a window's worth at a time
            for g in np.array_split(rng.permutation(len(s)), 4):
                g = np.sort(g)
                assert packed(reader, s[g].tolist(), e[g].tolist()) == b"".join(plain[a:b] for a, b in zip(s[g], e[g]))
    finally:
        reader.close()
        os.close(fd)


def test_kept_frame_starts_replace_the_second_decodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path, restarts = frames_file(tmp_path)
    s, e = blocks(restarts)
    streamed = []
    real = ZstdDecoder._streamed
    monkeypatch.setattr(ZstdDecoder, "_streamed", lambda self, *a: streamed.append(a[0]) or real(self, *a))
    reader, fd = reader_of(path, restarts)
    heads = reader.heads = FrameHeads()
    rng = np.random.default_rng(5)
    try:
        per_epoch = []
        for _ in range(2):
            streamed.clear()
            for g in np.array_split(rng.permutation(len(s)), 5):
                g = np.sort(g)
                assert packed(reader, s[g].tolist(), e[g].tolist()) == b"".join(PLAIN[a:b] for a, b in zip(s[g], e[g]))
            per_epoch.append(len(streamed))
        assert per_epoch[0] > 0 and per_epoch[1] == 0, per_epoch  # every start kept after one epoch
        assert 0 < heads.size < 64 * len(s)  # a record's end per frame, not frames
        reader.heads = None  # no kept starts: decoded again, the same bytes
        streamed.clear()
        g = np.arange(len(s))[::2]
        assert packed(reader, s[g].tolist(), e[g].tolist()) == b"".join(PLAIN[a:b] for a, b in zip(s[g], e[g]))
        assert len(streamed) > 0
    finally:
        reader.close()
        os.close(fd)


def test_frame_heads_stay_within_their_bound():
    heads = FrameHeads(most=1000)
    for i in range(100):
        heads.put(i, memoryview(bytes([i]) * 30))
    assert heads.size <= 1000
    out = bytearray(30)
    assert not heads.read(0, 30, memoryview(out))  # the least recently kept went first
    assert heads.read(99, 30, memoryview(out)) and out == bytes([99]) * 30
    assert not heads.read(99, 31, memoryview(bytearray(31)))  # never fewer bytes than asked
    heads.put(7, memoryview(b"x" * (zstd_decode.HEAD_MOST + 1)))  # too long to keep
    assert not heads.read(7, 1, memoryview(bytearray(1)))


def test_packed_runs_fill_the_copy_and_read_it_back(tmp_path: Path):
    path, restarts = frames_file(tmp_path)
    fill = FrameFill(str(tmp_path), "c", str(path), SourceStamp.of(path.stat()), restarts)
    reader, fd = reader_of(path, restarts)
    reader.fill, reader.heads = fill, FrameHeads()
    s, e = blocks(restarts)
    try:
        for g in np.array_split(np.random.default_rng(2).permutation(len(s)), 3):
            g = np.sort(g)
            assert packed(reader, s[g].tolist(), e[g].tolist()) == b"".join(PLAIN[a:b] for a, b in zip(s[g], e[g]))
        assert fill.written == fill.frames  # every frame written once, whole, from the window's buffer
        assert os.pread(fill.fd, len(PLAIN), 0) == PLAIN
    finally:
        fill.close()
        reader.close()
        os.close(fd)


def test_a_damaged_frame_is_an_error_not_bytes(tmp_path: Path):
    path, restarts = frames_file(tmp_path)
    blob = bytearray(path.read_bytes())
    i = 3
    mid = (int(restarts.packed[i]) + int(restarts.packed_end[i])) // 2
    blob[mid] ^= 0xFF
    path.write_bytes(bytes(blob))
    reader, fd = reader_of(path, restarts)
    reader.heads = FrameHeads()
    try:
        a, b = int(restarts.plain[i]) + 10, int(restarts.plain[i + 1])
        with pytest.raises(FormatError, match="corrupt zstd"):
            packed(reader, [a], [b])
    finally:
        reader.close()
        os.close(fd)
