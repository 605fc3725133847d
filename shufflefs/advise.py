"""How large must a block be for random block reads to run at nearly sequential speed?

Block shuffling pays off where storage is slow at small random reads and fast at large ones
(CorgiPile, Appendix A).  `probe` measures exactly that on the files already under a dataset
directory: random reads of each block size from 4 KiB to 16 MiB against a sequential read, at
queue depth 1 like the daemon's window loads.  The files are only read, never written.

Reads use ``O_DIRECT`` into page-aligned buffers so that the page cache cannot serve them; where
a filesystem refuses ``O_DIRECT`` the probe falls back to buffered reads, evicts the files' cached
pages before each measurement (``posix_fadvise(DONTNEED)``) and says that caches may still inflate
the figures.  Caches below the operating system (a disk's or a hypervisor's) are out of reach
either way; reading more data than they hold, at random offsets, keeps them honest enough.

`recommend` picks the smallest block size reaching ``target`` (90%) of sequential throughput and
splits a memory budget into the shuffle buffer: the daemon keeps about three windows per file
being read (the one served, the next one loading, one spare), so ``buffer = budget / 3``.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import time
from dataclasses import dataclass, field

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
BLOCK_SIZES = tuple(4 * KiB << i for i in range(13))
"""4 KiB, 8 KiB, ..., 16 MiB."""
ALIGN = 4096
"""Offset and length alignment of O_DIRECT reads (covers 512-byte and 4 KiB logical sectors)."""
WINDOWS_KEPT = 3
"""Windows in memory per file being read: the one served, the next one loading, one spare."""
SMALL_DATA = 1 << 30
"""Less data than this under SRC: reads repeat and caches below the OS may inflate the figures."""
MAX_FILES = 256


class AdviseError(Exception):
    """The probe cannot run (no readable data under the directory)."""


@dataclass(frozen=True)
class Measurement:
    block_size: int
    reads: int
    nbytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass
class ProbeResult:
    source: str
    files: int
    data_bytes: int
    direct: bool
    """True if every read used O_DIRECT."""
    sequential: Measurement
    random: list[Measurement]
    warnings: list[str] = field(default_factory=list)

    def fraction(self, m: Measurement) -> float:
        seq = self.sequential.mb_per_s
        return m.mb_per_s / seq if seq > 0 else 0.0


@dataclass(frozen=True)
class Advice:
    block_size: int
    reaches_target: bool
    """False if no block size reached the target: the largest measured is recommended."""
    buffer: int
    blocks_per_window: int
    budget: int
    target: float
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- files


def data_files(source: str | os.PathLike, limit: int = MAX_FILES) -> list[tuple[str, int]]:
    """(path, size) of the largest regular files under ``source`` (symlinks not followed)."""
    found: list[tuple[str, int]] = []
    for root, dirs, files in os.walk(source):
        dirs.sort()
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size >= ALIGN:
                found.append((path, st.st_size))
    found.sort(key=lambda f: -f[1])
    return found[:limit]


class _Files:
    """Open descriptors of the probed files, with O_DIRECT where the filesystem allows it."""

    def __init__(self, files: list[tuple[str, int]], direct: bool) -> None:
        self.paths = [p for p, _ in files]
        self.sizes = np.array([s for _, s in files], dtype=np.int64)
        self.fds: list[int] = []
        self.direct = direct and hasattr(os, "O_DIRECT")
        try:
            for p in self.paths:
                self.fds.append(self._open(p))
        except BaseException:
            self.close()
            raise

    def _open(self, path: str) -> int:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        if self.direct:
            try:
                return os.open(path, flags | os.O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._go_buffered()
        return os.open(path, flags)

    def _go_buffered(self) -> None:
        """O_DIRECT refused: reopen everything buffered."""
        self.direct = False
        old, self.fds = self.fds, []
        for fd in old:
            os.close(fd)
        for p in self.paths[: len(old)]:
            self.fds.append(os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))

    def evict(self, advice: int) -> None:
        """Buffered mode: drop the files' cached pages and set the readahead ``advice``."""
        if self.direct or not hasattr(os, "posix_fadvise"):
            return
        for fd in self.fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, advice)

    def read(self, i: int, offset: int, buf: memoryview) -> int:
        try:
            return os.preadv(self.fds[i], [buf], offset)
        except OSError as e:
            if e.errno != errno.EINVAL or not self.direct:
                raise
            self._go_buffered()  # e.g. a filesystem that accepts the flag but not the reads
            return os.preadv(self.fds[i], [buf], offset)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


# --------------------------------------------------------------------------- measuring


def _random_phase(files: _Files, block: int, seconds: float, rnd: np.random.Generator, buf: memoryview) -> Measurement | None:
    eligible = np.flatnonzero(files.sizes >= block)
    if len(eligible) == 0:
        return None
    weights = files.sizes[eligible] / files.sizes[eligible].sum()
    slots = (files.sizes - block) // ALIGN + 1
    files.evict(getattr(os, "POSIX_FADV_RANDOM", 0))
    view = buf[:block]
    reads = nbytes = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        # draw targets in batches: a numpy call per read would cost as much as a 4 KiB read
        which = rnd.choice(eligible, size=256, p=weights)
        offsets = (rnd.random(256) * slots[which]).astype(np.int64) * ALIGN
        for i, offset in zip(which.tolist(), offsets.tolist()):
            nbytes += files.read(i, offset, view)
            reads += 1
            if reads >= 2 and time.perf_counter() >= deadline:
                return Measurement(block, reads, nbytes, time.perf_counter() - t0)


class _Sequential:
    """Front-to-back reads of ``block`` bytes from a random aligned start in the largest file,
    continuing into the next files (and wrapping); measured in slices that resume where the
    previous one stopped, so that slices spread over the probe still read one sequence."""

    def __init__(self, files: _Files, block: int, rnd: np.random.Generator, buf: memoryview) -> None:
        self.files, self.block, self.buf = files, block, buf
        self.i = 0
        self.offset = int(rnd.integers(max(1, (int(files.sizes[0]) - block) // ALIGN))) * ALIGN
        self.slices: list[Measurement] = []

    def slice(self, seconds: float) -> None:
        files = self.files
        files.evict(getattr(os, "POSIX_FADV_SEQUENTIAL", 0))
        reads = nbytes = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            want = min(self.block, int(files.sizes[self.i]) - self.offset) // ALIGN * ALIGN
            got = files.read(self.i, self.offset, self.buf[:want]) if want > 0 else 0
            if got <= 0:
                self.i, self.offset = (self.i + 1) % len(files.fds), 0
                continue
            self.offset += got
            nbytes += got
            reads += 1
            if reads >= 2 and time.perf_counter() >= deadline:
                break
        self.slices.append(Measurement(self.block, reads, nbytes, time.perf_counter() - t0))

    def total(self) -> Measurement:
        m = self.slices
        return Measurement(self.block, sum(x.reads for x in m), sum(x.nbytes for x in m), sum(x.seconds for x in m))


def probe(source: str | os.PathLike, seconds: float = 5.0, block_sizes: tuple[int, ...] = BLOCK_SIZES,
          seed: int | None = None, direct: bool = True) -> ProbeResult:
    """Random reads of each block size and a sequential read over the files under ``source``.

    ``seconds`` is shared between the block sizes (one share each) and the sequential read (two
    shares, the denominator of every fraction), which is taken in slices between the random
    measurements so that a drift in the machine's load affects both sides alike.
    Raises `AdviseError` if ``source`` holds no file of at least 4 KiB.
    """
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    if not block_sizes or any(b <= 0 or b % ALIGN for b in block_sizes):
        raise ValueError(f"block sizes must be positive multiples of {ALIGN}")
    found = data_files(source)
    if not found:
        raise AdviseError(f"no regular file of at least {ALIGN} bytes under {os.fspath(source)!r}")
    total = sum(s for _, s in found)
    rnd = np.random.default_rng(seed)
    largest = max(block_sizes)
    share = seconds / (len(block_sizes) + 2)
    seq_slice = 2 * share / (len(block_sizes) + 1)
    area = mmap.mmap(-1, largest)  # page-aligned, as O_DIRECT needs
    buf = memoryview(area)
    files = _Files(found, direct)
    try:
        seq = _Sequential(files, largest, rnd, buf)
        seq.slice(seq_slice)
        randoms = []
        for block in sorted(block_sizes):
            m = _random_phase(files, block, share, rnd, buf)
            if m is not None:
                randoms.append(m)
            seq.slice(seq_slice)
        used_direct = files.direct
    finally:
        files.close()
        buf.release()
        area.close()
    sequential = seq.total()
    warnings = []
    if not used_direct:
        warnings.append(
            "O_DIRECT is not supported here: buffered reads, with the files' cached pages dropped "
            "(posix_fadvise DONTNEED) before each measurement; pages cached elsewhere (a FUSE or "
            "network filesystem's server, another mapping) can still make small reads look faster "
            "than the storage is"
        )
    if total < SMALL_DATA:
        warnings.append(
            f"only {total / MiB:.0f} MiB of data under the directory: reads revisit the same bytes, "
            "and caches below the operating system (disk, hypervisor) may inflate the figures"
        )
    skipped = [b for b in block_sizes if b > int(max(s for _, s in found))]
    if skipped:
        warnings.append(f"no file is large enough for random reads of {_size(min(skipped))} and more")
    return ProbeResult(os.fspath(source), len(found), total, used_direct, sequential, randoms, warnings)


# --------------------------------------------------------------------------- advice


def recommend(result: ProbeResult, budget: int, target: float = 0.9) -> Advice:
    """The smallest block size from which on every measured size reaches ``target`` of sequential
    throughput (so one lucky measurement of a small size does not decide), and the buffer:
    ``budget / 3`` rounded down to whole blocks (and whole MiB), with its blocks per window."""
    if budget <= 0:
        raise ValueError("budget must be positive")
    if not result.random:
        raise AdviseError("no random reads were measured")
    ordered = sorted(result.random, key=lambda m: m.block_size)
    block = None
    for m in reversed(ordered):
        if result.fraction(m) < target:
            break
        block = m.block_size
    reaches = block is not None
    notes = []
    if block is None:
        block = ordered[-1].block_size
        notes.append(f"the largest block size measured does not reach {target:.0%} of sequential throughput; "
                     "it is recommended anyway")
    unit = max(block, MiB) if max(block, MiB) % block == 0 else block
    buffer = budget // WINDOWS_KEPT // unit * unit
    if buffer < 2 * block:
        notes.append(f"a budget of {_size(budget)} holds fewer than 2 blocks of {_size(block)} per window: "
                     "records would only be shuffled among neighbours; raise --budget")
        buffer = max(buffer, block)
    whole = -(-result.data_bytes // block) * block  # the data, in whole blocks
    if buffer >= whole:
        notes.append(f"the whole data ({_size(result.data_bytes)}) fits in the buffer the budget allows: "
                     "--buffer 100% shuffles it all at once (or use --strategy full)")
        buffer = whole
    return Advice(block, reaches, buffer, buffer // block, budget, target, tuple(notes))


def format_report(result: ProbeResult, advice: Advice) -> str:
    mode = "O_DIRECT" if result.direct else "buffered (no O_DIRECT)"
    lines = [
        f"storage under {result.source}: {result.files} files, {_size(result.data_bytes)}; "
        f"{mode} reads at queue depth 1",
        "",
    ]
    rows = [["read", "reads", "MB/s", "of sequential", ""]]
    for m in sorted(result.random, key=lambda m: m.block_size):
        rows.append([f"random {_size(m.block_size)}", str(m.reads), f"{m.mb_per_s:.1f}", f"{result.fraction(m):.2f}",
                     "<- recommended" if m.block_size == advice.block_size else ""])
    s = result.sequential
    rows.append(["sequential", str(s.reads), f"{s.mb_per_s:.1f}", "1.00", f"({_size(s.block_size)} reads)"])
    lines += aligned(rows)
    lines.append("")
    reach = (f"the smallest from which on every size reaches {advice.target:.0%} of sequential throughput"
             if advice.reaches_target else f"no block size reached {advice.target:.0%} of sequential throughput")
    lines.append(f"block size: {_size(advice.block_size)} ({reach})")
    lines.append(f"buffer:     {_size(advice.buffer)} = {advice.blocks_per_window} blocks per window "
                 f"(budget {_size(advice.budget)} / {WINDOWS_KEPT}: the window served, the next one loading, "
                 "one spare; per file read at once)")
    lines.append(f"use:        shufflefs mount SRC MNT --block-size {_flag(advice.block_size)} "
                 f"--buffer {_flag(advice.buffer)}")
    for note in advice.notes:
        lines.append(f"note: {note}")
    for w in result.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows as lines of right-aligned columns two spaces apart (the last column left-aligned),
    each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.rjust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in rows]


def _size(n: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= f:
            v = n / f
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def _flag(n: int) -> str:
    """The exact size as `shufflefs mount` reads it back."""
    for unit, f in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


__all__ = ["BLOCK_SIZES", "AdviseError", "Advice", "Measurement", "ProbeResult", "data_files", "format_report",
           "probe", "recommend"]
