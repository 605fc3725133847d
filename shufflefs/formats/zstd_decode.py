"""Reading a zstd file's decoded bytes from its frames (its restart points).

A view's window asks for runs of decoded bytes: with the default block size and a file in frames
of 1 MiB, each run is one block, the records that start in one frame, and its last record runs
into the next frame.  So a run needs all of one frame but its first bytes (the end of the
record of the block before), and the first bytes of the next.  Two things keep that from costing
more than decoding the frame:

* The runs of a window lie back to back in its buffer, and are filled last first
  (`ZstdDecoder.read_packed`): a frame a run covers to its end is decoded whole straight into its
  place there, its bytes before the run landing where the runs before go, which are filled after
  it.  Through a buffer of its own, each decoded byte was copied once more (`memmove`: 10% of
  the daemon's samples in an epoch read from frames).
* The bytes of a frame before the first run that starts in it are kept (`FrameHeads`): they are
  the end of the record the run of the block before needs, which otherwise decodes the frame's
  start a second time (at least one zstd block of it: 0.29 CPU-s an epoch for a GiB of 1 MiB
  frames, against 1.83 for decoding the frames themselves).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from itertools import accumulate
from typing import Protocol

import numpy as np

from ..index.decoded import Restarts
from .range_file import RangeFile, Read, read_full

STREAM_READ = 64 << 10
"""Compressed bytes a zstd stream reader of a frame's first bytes asks for at a time: such a
read needs a few KiB decoded (the end of a record that runs into the next frame)."""
SKIP_STEP = 4 << 20
"""Decoded bytes skipped at a time by a stream reader on its way to a read's start."""
WHOLE_FRAME = 0.5
"""A read that needs a zstd frame up to this fraction of it or further decodes the whole frame
(one-shot, kept for the next read of it); a shorter one decodes only what it needs, as a stream."""
HEAD_MOST = 64 << 10
"""The longest frame start `FrameHeads` keeps (a longer one is decoded again when needed)."""
HEADS_MOST = 4 << 20
"""Bytes of frame starts kept per file version, the least recently kept dropped past it: a GiB
of JSON lines of about 1 KiB in 1 MiB frames keeps about 0.5 MB."""


class Fill(Protocol):
    """A copy being filled with the frames views decode (`stages.frame_fill.FrameFill`)."""

    def offer(self, i: int, data: memoryview) -> None: ...

    def read(self, i: int, at: int, out: memoryview) -> bool: ...


class FrameHeads:
    """The first bytes of frames of one file version, as decoded whole (their checksums
    verified), shared by its decoders (module docstring)."""

    def __init__(self, most: int = HEADS_MOST) -> None:
        self.most, self.size = most, 0
        self._heads: "OrderedDict[int, bytes]" = OrderedDict()
        self._lock = threading.Lock()

    def put(self, i: int, head: memoryview) -> None:
        if not 0 < len(head) <= HEAD_MOST:
            return
        with self._lock:
            if len(self._heads.get(i, b"")) >= len(head):
                return
            self.size += len(head) - len(self._heads.pop(i, b""))
            self._heads[i] = bytes(head)
            while self.size > self.most:
                self.size -= len(self._heads.popitem(last=False)[1])

    def read(self, i: int, n: int, out: memoryview) -> bool:
        """``out`` from frame ``i``'s first ``n`` bytes, if they are kept."""
        with self._lock:
            head = self._heads.get(i)
        if head is None or len(head) < n:
            return False
        out[:] = head[:n]
        return True


def decode_frame(dctx: object, packed: bytes, out: memoryview, i: int) -> None:
    """Decode zstd frame ``i`` (its compressed bytes ``packed``) into ``out``, exactly its decoded
    size, to the frame's end (its checksum verified)."""
    with dctx.stream_reader(packed, read_size=len(packed), read_across_frames=False) as reader:  # type: ignore[attr-defined]
        read_full(reader, out, lambda done: f"frame {i} decodes to {done} bytes, not {len(out)}")
        if reader.read(1):
            raise EOFError(f"frame {i} decodes to more than {len(out)} bytes")


class ZstdDecoder:
    """Reads decoded bytes of a zstd file.  A read that needs most of a frame (`WHOLE_FRAME` of
    it or more) decodes the whole frame in one call (straight into the read's buffer where the
    buffer has room for it, `read_packed`; else into a buffer of its own, kept so that the next
    read of that frame copies from it); a read of a frame's first bytes only (the end of a
    block's last record, which runs into the next frame) takes them from `heads` if they are
    kept, else decodes the frame as a stream from its start up to where the read ends, no
    further, and the next read goes on from there when it starts at or after that point."""

    def __init__(self, read: Read, restarts: Restarts, fd: int = -1) -> None:
        """``fd``: a descriptor of the file the decoder owns (read by preads)."""
        import zstandard

        self._read, self.r, self._fd = read, restarts, fd
        self._dctx = zstandard.ZstdDecompressor()
        self._stream: tuple[int, int, object] | None = None  # (frame, decoded position, reader)
        self._frame: tuple[int, memoryview] | None = None  # (frame, its decoded bytes in _buf)
        self._buf = bytearray(0)
        self.fill: Fill | None = None  # the file's copy being filled (`stages.frame_fill`), if any
        self.heads: FrameHeads | None = None  # the file version's kept frame starts, if any

    def _packed(self, i: int, s: int, e: int) -> bytes:
        """Compressed bytes ``[s, e)`` of frame ``i`` (offsets within the frame)."""
        a = int(self.r.packed[i])
        if self._fd >= 0:  # preads: a duplicate descriptor shares its offset with the others
            got = os.pread(self._fd, e - s, a + s)
            if len(got) != e - s:
                raise EOFError(f"frame {i} is cut short at compressed byte {a + s + len(got)}")
            return got
        return bytes(self._read(a + s, a + e))

    def _decode(self, i: int, out: memoryview) -> None:
        """Frame ``i`` decoded whole into ``out`` (its decoded size), its checksum verified, and
        offered to the copy being filled."""
        decode_frame(self._dctx, self._packed(i, 0, int(self.r.packed_end[i]) - int(self.r.packed[i])), out, i)
        if self.fill is not None:
            self.fill.offer(i, out)

    def _whole(self, i: int, size: int) -> memoryview:
        """Frame ``i`` decoded whole (``size`` bytes, as the index says) into the decoder's buffer,
        kept (a new 1 MiB of bytes per frame, mapped and faulted in anew, made zstd's one-shot
        decode 1.6x as costly)."""
        got = self._frame
        if got is not None and got[0] == i:
            return got[1]
        self._frame = None
        if len(self._buf) < size:
            self._buf = bytearray(size)
        data = memoryview(self._buf)[:size]
        self._decode(i, data)
        self._frame = (i, data)
        return data

    def _streamed(self, i: int, at: int, out: memoryview) -> None:
        """``out`` from decoded byte ``at`` of frame ``i``, decoding it as a stream (continued
        from the last read where it ended at or before ``at``)."""
        got = self._stream
        if got is None or got[0] != i or got[1] > at:
            raw = RangeFile(lambda s, e: self._packed(i, s, e), int(self.r.packed_end[i]) - int(self.r.packed[i]))
            reader = self._dctx.stream_reader(raw, read_size=STREAM_READ, read_across_frames=False, closefd=False)
            got = (i, 0, reader)
        _, pos, reader = got
        while pos < at:
            skipped = len(reader.read(min(SKIP_STEP, at - pos)))
            if not skipped:
                raise EOFError(f"frame {i} ended at decoded byte {pos}")
            pos += skipped
        read_full(reader, out, lambda done: f"frame {i} ended at decoded byte {pos + done}")
        self._stream = (i, pos + len(out), reader)

    def _piece(self, i: int, a: int, b: int, buf: memoryview, p: int) -> None:
        """``buf[p: p + b - a]``: decoded bytes ``[a, b)`` of frame ``i``; the bytes of ``buf``
        before ``p`` may be written over (`read_packed` fills them after)."""
        f0, f1 = int(self.r.plain[i]), int(self.r.plain[i + 1])
        out = buf[p: p + b - a]
        got, fill, heads = self._frame, self.fill, self.heads
        if got is not None and got[0] == i:
            out[:] = got[1][a - f0: b - f0]
            return
        if a == f0 and heads is not None and heads.read(i, b - f0, out):
            return  # the end of a record that runs into frame i, kept when the frame was decoded whole
        if fill is not None and fill.read(i, a - f0, out):
            return  # decoded before, by this view or another: read back from the copy being filled
        if fill is None and b - f0 < WHOLE_FRAME * (f1 - f0):
            self._streamed(i, a - f0, out)
            return
        if b == f1 and p >= a - f0:
            whole = buf[p - (a - f0): p + (b - a)]  # the frame's start lands before ``out``
            self._decode(i, whole)
        else:
            whole = self._whole(i, f1 - f0)
            out[:] = whole[a - f0: b - f0]
        if heads is not None and a > f0:
            heads.put(i, whole[: a - f0])

    def read_packed(self, buf: memoryview, starts: list[int], ends: list[int]) -> None:
        """Decoded bytes ``[starts[k], ends[k])`` (ascending, disjoint) back to back in ``buf``,
        filled last first (module docstring)."""
        pos = list(accumulate((e - s for s, e in zip(starts, ends)), initial=0))
        plain = self.r.plain
        for k in range(len(starts) - 1, -1, -1):
            s, at = starts[k], ends[k]
            while at > s:
                i = int(np.searchsorted(plain, at - 1, side="right")) - 1
                if i >= len(plain) - 1:
                    raise EOFError(f"the decoded stream ended at {int(plain[-1])}")
                a = max(s, int(plain[i]))
                self._piece(i, a, at, buf, pos[k] + a - s)
                at = a

    def close(self) -> None:
        self._stream = self._frame = None
        self._buf = bytearray(0)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
