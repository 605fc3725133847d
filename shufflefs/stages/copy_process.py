"""A background decoded copy, made by a child process of the mount.

Made in a thread of the daemon, a background copy decoded the whole file in Python beside the
views' own decoding, and the two took turns at the interpreter's lock.  On a 1.06 GiB gzip file
whose index was cached and whose copy was not kept, the first epoch of a later mount read 0.81x
the records/s of ``gzip.open`` over the source with the copy made in a thread, 0.96-0.97x with
it made here, and the copy was made within that epoch both times (docs/benchmark.md, compressed
text views).  The child reads the descriptor the daemon opened (the indexed file, whatever its
path names now), writes the copy to the descriptor of the daemon's temporary file, verifies
every checksum as the thread did (`formats.compressed.inflate`, `formats.codecs.decode_all`),
runs at the background's niceness, and dies with the daemon (``PR_SET_PDEATHSIG``).  Its memory
(the interpreter, the decoder and the `StepWriter`'s buffers: a peak of 44-62 MiB measured on
1.06 GiB files) is its own, not the daemon's.

The child also decodes the frames of a zstd copy that its views did not fill (`frame_fill`).
Run as ``python -m shufflefs.stages.copy_process SOURCE_FD SIZE CODEC OUT_FD DIRECTORY PATH NICE
PARENT``; the daemon's side is `decode_in_child`.  Blocking, no FUSE.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from typing import Any, BinaryIO, Callable, Sequence

import numpy as np

from ..errors import FormatError, ShuffleError, StaleSourceError
from ..formats.codecs import GZIP, decode_all
from ..formats.compressed import StepWriter, inflate
from ..formats.zstd_decode import decode_frame
from ..scratch import pwrite_all

EXIT_NO_ROOM, EXIT_DAMAGED, EXIT_CHANGED = 2, 3, 4
"""The child's exit codes besides 0: a write failed (or the disk would keep too little room), the
stream is damaged, the file is not the indexed one any more."""
FRAMES = "zstd-frames"
"""The codec argument that has the child decode the zstd frames listed on its input (`decode_frames`)."""
POLL = 0.2
"""Seconds between looks at whether the mount is stopping while a child runs."""


def decode_in_child(source_fd: int, size: int, codec: str, out: BinaryIO | int, directory: str, path: str,
                    nice: int, stopping: Callable[[], bool], frames: np.ndarray | None = None) -> int | None:
    """Decode the compressed file open as ``source_fd`` (``size`` bytes) into ``out`` (empty, at
    its start) in a child process; the decoded bytes written, or None if ``stopping`` turned
    true first (the child is then killed).  ``frames``: only these zstd frames, each written at
    its place (rows: compressed start and end, decoded start and end; `decode_frames`).  A
    damaged stream is `FormatError`, a changed file `StaleSourceError`, a full disk or failed
    write `OSError`, all naming ``path``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    out_fd = out if isinstance(out, int) else out.fileno()
    cmd = [sys.executable, "-m", __name__, str(source_fd), str(size), FRAMES if frames is not None else codec,
           str(out_fd), directory, path, str(nice), str(os.getpid())]
    table = None if frames is None else np.ascontiguousarray(frames, np.int64).tobytes()
    proc = subprocess.Popen(cmd, pass_fds=(source_fd, out_fd), stdin=subprocess.DEVNULL if table is None
                            else subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        while True:
            try:
                got, err = proc.communicate(table, timeout=POLL)
                break
            except subprocess.TimeoutExpired:
                table = None  # handed on by the first call, which goes on writing it
                if stopping():
                    return None
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    why = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
    if proc.returncode == 0:
        return int(got)
    if proc.returncode == EXIT_NO_ROOM:
        raise OSError(errno.ENOSPC, f"{path}: decoded copy not written: {why}")
    if proc.returncode == EXIT_DAMAGED:
        raise FormatError(path, None, why)
    if proc.returncode == EXIT_CHANGED:
        raise StaleSourceError(path, None, why)
    raise OSError(errno.EIO, f"{path}: the process decoding its copy ended with status {proc.returncode}: {why}")


def _die_with(parent: int) -> None:
    """Be killed when the daemon ends, however it ends."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def decode_into(out: BinaryIO, directory: str, codec: str, read: Callable[[int, int], Any], size: int, path: str,
                by_zlib: bool, stopping: Callable[[], bool] = lambda: False) -> int | None:
    """Decode a compressed file of ``size`` bytes (``read(start, end)``) into ``out``, written by a
    `StepWriter` (writing overlaps decoding; it stops short of a full disk), gzip by zlib if
    ``by_zlib`` (`inflate`: every member checked, a few hundred KiB held); what a copy is made
    with, by the thread or by the child.  The bytes written, or None if ``stopping`` turned true;
    `OSError` if a write failed or the disk would keep too little room, `FormatError` or
    `StaleSourceError` from the decoder."""
    steps = inflate(read, size, path) if by_zlib and codec == GZIP else decode_all(codec, read, size, path)[0]
    writer = StepWriter(out, directory)
    written = 0
    try:
        for step in steps:
            if stopping():
                return None
            writer(step)
            written += len(step)
    finally:
        writer.close()
    if writer.stopped is not None:
        raise writer.error or OSError(errno.ENOSPC, writer.stopped)
    return written


def decode_frames(read: Callable[[int, int], bytes], frames: np.ndarray, out_fd: int, path: str,
                  stopping: Callable[[], bool] = lambda: False) -> int | None:
    """Decode the zstd frames ``frames`` (rows of compressed start and end, decoded start and
    end) of a file (``read(start, end)``) and write each at its decoded start in ``out_fd``,
    checksums verified; the bytes written, or None if ``stopping`` turned true."""
    import zstandard

    dctx, buf, written = zstandard.ZstdDecompressor(), bytearray(0), 0
    for a, b, s, e in np.asarray(frames, np.int64).reshape(-1, 4).tolist():
        if stopping():
            return None
        packed = read(a, b)
        if len(packed) != b - a:
            raise StaleSourceError(path, a + len(packed), "ends inside a zstd frame it was indexed with")
        if len(buf) < e - s:
            buf = bytearray(e - s)
        out = memoryview(buf)[: e - s]
        try:
            decode_frame(dctx, packed, out, -1)
        except (zstandard.ZstdError, EOFError) as err:
            raise FormatError(path, a, f"corrupt zstd frame at compressed byte {a}: {err}") from None
        pwrite_all(out_fd, out, s)
        written += len(out)
    return written


def main(argv: Sequence[str]) -> int:
    source_fd, size, codec, out_fd, directory, path, nice, parent = argv
    _die_with(int(parent))
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(nice))
    except OSError:
        pass
    fd = int(source_fd)
    out = os.fdopen(int(out_fd), "wb", closefd=False)
    read = lambda a, b: os.pread(fd, b - a, a)  # noqa: E731
    try:
        if codec == FRAMES:
            written = decode_frames(read, np.frombuffer(sys.stdin.buffer.read(), np.int64), int(out_fd), path)
        else:
            written = decode_into(out, directory, codec, read, int(size), path, True)
            out.flush()
    except StaleSourceError as e:
        print(e, file=sys.stderr)
        return EXIT_CHANGED
    except ShuffleError as e:
        print(e, file=sys.stderr)
        return EXIT_DAMAGED
    except OSError as e:
        print(e, file=sys.stderr)
        return EXIT_NO_ROOM
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
