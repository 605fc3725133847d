"""Level: pure (no FUSE; real decoders, a real child process).

A zstd file's background copy is filled with the frames its views decode (`stages.frame_fill`):
a decoder writes each frame it decodes whole into the copy and reads frames already there back
instead of decoding them again; the frames no view decoded are decoded by a child, and the copy
is taken only once every frame is in it, byte for byte the decoded file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zstandard

from shufflefs.errors import FormatError
from shufflefs.formats.codecs import DecodedReader, decode_all
from shufflefs.index.table import SourceStamp
from shufflefs.stages import frame_fill
from shufflefs.stages.copy_process import decode_frames, decode_in_child
from shufflefs.stages.frame_fill import FrameFill

PLAIN = b"".join(b'{"i": %d, "text": "%s"}\n' % (i, b"xyz" * (i % 40)) for i in range(40000))
FRAME = 64 << 10


def frames_file(tmp_path: Path, plain: bytes = PLAIN) -> tuple[Path, object]:
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    path = tmp_path / "f.jsonl.zst"
    path.write_bytes(b"".join(cctx.compress(plain[i: i + FRAME]) for i in range(0, len(plain), FRAME)))
    blob = path.read_bytes()
    steps, restarts = decode_all("zstd", lambda a, b: blob[a:b], len(blob), str(path))
    assert b"".join(bytes(s) for s in steps) == plain
    return path, restarts()


def table(restarts, frames: np.ndarray) -> np.ndarray:
    return np.stack([restarts.packed[frames], restarts.packed_end[frames], restarts.plain[frames],
                     restarts.plain[frames + 1]], axis=1)


def test_views_decoding_fills_the_copy_and_reads_it_back(tmp_path: Path):
    path, restarts = frames_file(tmp_path)
    fill = FrameFill(str(tmp_path), "c", str(path), SourceStamp.of(path.stat()), restarts)
    fd = os.open(path, os.O_RDONLY)
    reader = DecodedReader(restarts, lambda a, b: os.pread(fd, b - a, a), path.stat().st_size, str(path), fd=fd)
    reader.fill = fill
    try:
        rng = np.random.default_rng(1)
        for _ in range(300):  # random runs, as windows read them: whole frames and first bytes
            a = int(rng.integers(0, len(PLAIN) - 1))
            n = int(rng.integers(1, 3 * FRAME))
            out = bytearray(min(n, len(PLAIN) - a))
            reader.into(a, memoryview(out))
            assert bytes(out) == PLAIN[a: a + len(out)]
        assert 0 < fill.written <= fill.frames
        filled = np.flatnonzero(fill._state == 2)
        for i in filled.tolist():  # what is in the copy is the frame's decoded bytes
            s, e = int(restarts.plain[i]), int(restarts.plain[i + 1])
            assert os.pread(fill.fd, e - s, s) == PLAIN[s:e]
        rest = []
        assert fill.complete(lambda: False, lambda: None,
                             lambda frames: rest.append(frames) or decode_frames(
                                 lambda a, b: os.pread(fd, b - a, a), table(restarts, frames), fill.fd, str(path))
                             is not None)
        assert len(rest) == (fill.frames > len(filled)) and fill.written == fill.frames
    finally:
        reader.close()
        os.close(fd)
        fill.close(str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == PLAIN
    assert not list(tmp_path.glob("part-*"))


def test_a_copy_no_view_fills_is_decoded_by_the_child_after_the_idle_time(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(frame_fill, "IDLE", 0.3)
    path, restarts = frames_file(tmp_path)
    fill = FrameFill(str(tmp_path), "c", str(path), SourceStamp.of(path.stat()), restarts)
    fd = os.open(path, os.O_RDONLY)
    try:
        fill.offer(1, memoryview(PLAIN[int(restarts.plain[1]): int(restarts.plain[2])]))
        got = []

        def rest(frames: np.ndarray) -> bool:
            got.append(frames)
            return decode_in_child(fd, path.stat().st_size, "zstd", fill.fd, str(tmp_path), str(path), 10,
                                   lambda: False, table(restarts, frames)) is not None

        assert fill.complete(lambda: False, lambda: None, rest)
        assert len(got) == 1 and 1 not in got[0] and len(got[0]) == fill.frames - 1
    finally:
        os.close(fd)
        fill.close(str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == PLAIN


def test_a_damaged_frame_the_child_decodes_is_a_format_error_and_nothing_is_kept(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(frame_fill, "IDLE", 0.1)
    path, restarts = frames_file(tmp_path)
    blob = bytearray(path.read_bytes())
    at = int(restarts.packed[3]) + 40  # inside frame 3's compressed bytes
    blob[at: at + 8] = b"\xff" * 8
    path.write_bytes(bytes(blob))
    fill = FrameFill(str(tmp_path), "c", str(path), SourceStamp.of(path.stat()), restarts)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="zstd frame"):
            fill.complete(lambda: False, lambda: None, lambda frames: decode_in_child(
                fd, len(blob), "zstd", fill.fd, str(tmp_path), str(path), 10, lambda: False,
                table(restarts, frames)) is not None)
    finally:
        os.close(fd)
        fill.close()
    assert not list(tmp_path.glob("part-*"))


def test_a_stopped_fill_or_a_disk_without_room_keeps_nothing(tmp_path: Path):
    path, restarts = frames_file(tmp_path)
    fill = FrameFill(str(tmp_path), "c", str(path), SourceStamp.of(path.stat()), restarts)
    assert fill.complete(lambda: True, lambda: None, lambda frames: True) is False
    with pytest.raises(OSError, match="free bytes"):
        fill.complete(lambda: False, lambda: "the disk has 3 free bytes", lambda frames: True)
    fill.close()
    assert not list(tmp_path.glob("part-*"))
    fill.offer(0, memoryview(PLAIN[: int(restarts.plain[1])]))  # after close: neither written nor an error
    assert fill.written == 0 and fill.read(0, 0, memoryview(bytearray(10))) is False


def test_a_frame_table_decodes_each_frame_at_its_place(tmp_path: Path):
    path, restarts = frames_file(tmp_path)
    blob = path.read_bytes()
    out = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT)
    try:
        frames = np.arange(restarts.points)[::-1]  # in any order
        written = decode_frames(lambda a, b: blob[a:b], table(restarts, frames), out, str(path))
        assert written == len(PLAIN)
    finally:
        os.close(out)
    assert (tmp_path / "out").read_bytes() == PLAIN


def test_an_empty_file_has_an_empty_copy_at_once(tmp_path: Path):
    path = tmp_path / "empty.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b""))
    blob = path.read_bytes()
    steps, restarts = decode_all("zstd", lambda a, b: blob[a:b], len(blob), str(path))
    assert b"".join(bytes(s) for s in steps) == b""
    fill = FrameFill(str(tmp_path), "c", str(path), SourceStamp.of(path.stat()), restarts())
    assert fill.complete(lambda: False, lambda: None, lambda frames: pytest.fail("nothing to decode"))
    fill.close(str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b""
