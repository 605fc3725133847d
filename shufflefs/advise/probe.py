"""How large must a block be for random block reads to run at nearly sequential speed?

Block shuffling pays off where storage is slow at small random reads and fast at large ones
(CorgiPile, Appendix A).  `probe` measures exactly that on the files already under a dataset
directory: random reads of each block size from 4 KiB to 16 MiB against a sequential read, two
ways: at queue depth 1 (``O_DIRECT``, one read at a time), and the way the views load a cold
window (`shufflefs.windows.view.View.hint`): ``posix_fadvise(WILLNEED)`` on every block of a window of
`WINDOW` bytes and of the next window, then buffered 1 MiB preads in ascending offset order from
one thread, so that the kernel's readahead of the hinted ranges sets the queue depth.  The block
size is recommended from the latter, against a buffered sequential read (the kernel's readahead).
The files are only read, never written.  `advise.cache` keeps the result per device
(`measured_block_floor` is what a mount reads).

Measured with ``tools/cold_io.py`` (retired, in git at 62680a3; 2-core VM, virtio disk with 8 MiB readahead, 8 GiB file, page
cache dropped): see `strategies.base.AUTO_BLOCK_FLOOR`.

Reads use ``O_DIRECT`` into page-aligned buffers so that the page cache cannot serve them; where
a filesystem refuses ``O_DIRECT`` the probe falls back to buffered reads, evicts the files' cached
pages before each measurement (``posix_fadvise(DONTNEED)``) and says that caches may still inflate
the figures.  Caches below the operating system (a disk's or a hypervisor's) are out of reach
either way; reading more data than they hold, at random offsets, keeps them honest enough.

`recommend` picks the smallest block size reaching ``target`` (90%) of sequential throughput and
splits a memory budget into the shuffle buffer: the daemon keeps about three windows per file
being read (the one served, the next one loading, one spare), so ``buffer = budget / 3``.
`for_mix` sizes the buffer for a shuffle-quality target instead: the blocks per buffer at which
the expected label mix of 1,000-record windows (`shufflefs.quality`) is at most a given value.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import time
from dataclasses import dataclass, field

import numpy as np

from .cache import FLOOR_TARGET, floor_of, measured_block_floor

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
WINDOW = 64 * MiB
"""Bytes of blocks per window in the views-depth measurement (a typical shuffle buffer)."""
READ_CHUNK = MiB
"""Bytes per pread of the views-depth measurement (`shufflefs.windows.view.READ_CHUNK`)."""
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
    """Queue depth 1 (O_DIRECT where allowed), against `sequential`."""
    warnings: list[str] = field(default_factory=list)
    windowed: list[Measurement] = field(default_factory=list)
    """At the views' depth (WILLNEED on a window's and the next window's blocks, ascending
    buffered preads), against `buffered_sequential`."""
    buffered_sequential: Measurement | None = None
    window_bytes: int = WINDOW

    def fraction(self, m: Measurement) -> float:
        seq = self.sequential.mb_per_s
        return m.mb_per_s / seq if seq > 0 else 0.0

    def window_fraction(self, m: Measurement) -> float:
        seq = self.buffered_sequential.mb_per_s if self.buffered_sequential is not None else 0.0
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


class _Slots:
    """Distinct random blocks of ``block`` bytes over the files (each file cut into whole blocks),
    in the order of an affine permutation of all of them, ``per`` at a time, sorted by file and
    offset as a view's window reads them; when all are used the files are evicted and a new
    permutation starts."""

    def __init__(self, files: _Files, block: int, rnd: np.random.Generator) -> None:
        self.files, self.block, self.rnd = files, block, rnd
        self.eligible = np.flatnonzero(files.sizes >= block)
        self.cum = np.concatenate(([0], np.cumsum(files.sizes[self.eligible] // block)))
        self.n = int(self.cum[-1])
        self._restart()

    def _restart(self) -> None:
        n = max(self.n, 1)
        a = int(self.rnd.integers(n // 3 + 1, n)) if n > 2 else 1
        while np.gcd(a, n) != 1:
            a += 1
        self.a, self.c, self.i = a, int(self.rnd.integers(n)), 0

    def take(self, per: int) -> tuple[np.ndarray, np.ndarray]:
        if self.i + per > self.n:
            self.files.evict(getattr(os, "POSIX_FADV_NORMAL", 0))
            self._restart()
        g = (np.arange(self.i, self.i + per, dtype=np.int64) * self.a + self.c) % self.n
        self.i += per
        slot = np.searchsorted(self.cum, g, side="right") - 1
        which, offset = self.eligible[slot], (g - self.cum[slot]) * self.block
        order = np.lexsort((offset, which))
        return which[order], offset[order]


def _window_phase(files: _Files, block: int, seconds: float, rnd: np.random.Generator, buf: memoryview,
                  window: int = WINDOW) -> Measurement | None:
    """Random blocks read the way `shufflefs.windows.view.View` loads windows of a cold source: before
    each window, WILLNEED on every block of it and of the next window (the kernel reads them
    ahead, as many at once as it queues), then the window's blocks in ascending order by
    `READ_CHUNK` preads from this one thread.  Buffered descriptors (``files``)."""
    slots = _Slots(files, block, rnd)
    if slots.n == 0:
        return None
    per = max(1, min(window // block, slots.n // 4))
    files.evict(getattr(os, "POSIX_FADV_NORMAL", 0))
    will = getattr(os, "POSIX_FADV_WILLNEED", 3)

    def hint(w: tuple[np.ndarray, np.ndarray]) -> None:
        for i, off in zip(w[0].tolist(), w[1].tolist()):
            os.posix_fadvise(files.fds[i], off, block, will)

    reads = nbytes = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    current = slots.take(per)
    while True:
        following = slots.take(per)
        hint(current)
        hint(following)
        for i, off in zip(current[0].tolist(), current[1].tolist()):
            for at in range(off, off + block, READ_CHUNK):
                nbytes += files.read(i, at, buf[: min(READ_CHUNK, off + block - at)])
                reads += 1
                if reads >= 2 and time.perf_counter() >= deadline:
                    return Measurement(block, reads, nbytes, time.perf_counter() - t0)
        current = following


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

    Each block size is read twice: at queue depth 1 (`_random_phase`, O_DIRECT where allowed)
    and at the views' depth (`_window_phase`, buffered).  ``seconds`` is shared between those
    (one share each) and two sequential reads (two shares each: O_DIRECT reads of the largest
    block size, the denominator at depth 1, and buffered 1 MiB reads with the kernel's readahead,
    the denominator at the views' depth), each taken in slices between the random measurements
    so that a drift in the machine's load affects both sides alike.
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
    share = seconds / (2 * len(block_sizes) + 4)
    seq_slice = 2 * share / (len(block_sizes) + 1)
    area = mmap.mmap(-1, max(largest, READ_CHUNK))  # page-aligned, as O_DIRECT needs
    buf = memoryview(area)
    files = _Files(found, direct)
    try:
        buffered = _Files(found, False) if hasattr(os, "posix_fadvise") else None
    except BaseException:
        files.close()
        raise
    try:
        seq = _Sequential(files, largest, rnd, buf)
        bseq = _Sequential(buffered, READ_CHUNK, rnd, buf) if buffered is not None else None
        seq.slice(seq_slice)
        if bseq is not None:
            bseq.slice(seq_slice)
        randoms, windowed = [], []
        for block in sorted(block_sizes):
            m = _random_phase(files, block, share, rnd, buf)
            if m is not None:
                randoms.append(m)
            seq.slice(seq_slice)
            if bseq is not None:
                m = _window_phase(buffered, block, share, rnd, buf)
                if m is not None:
                    windowed.append(m)
                bseq.slice(seq_slice)
        used_direct = files.direct
    finally:
        files.close()
        if buffered is not None:
            buffered.close()
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
    return ProbeResult(os.fspath(source), len(found), total, used_direct, sequential, randoms, warnings,
                       windowed, bseq.total() if bseq is not None else None)


# --------------------------------------------------------------------------- advice


def recommend(result: ProbeResult, budget: int, target: float = FLOOR_TARGET) -> Advice:
    """The smallest block size reaching ``target`` of sequential throughput with the next larger
    size and 3/4 of the larger ones (`shufflefs.advise_cache.floor_of`) at the views' depth
    (at queue depth 1 if the probe has no such measurements), and the buffer: ``budget / 3``
    rounded down to whole blocks (and whole MiB), with its blocks per window."""
    if budget <= 0:
        raise ValueError("budget must be positive")
    views = bool(result.windowed)
    rows = result.windowed if views else result.random
    fraction = result.window_fraction if views else result.fraction
    if not rows:
        raise AdviseError("no random reads were measured")
    ordered = sorted(rows, key=lambda m: m.block_size)
    block = floor_of([{"block_size": m.block_size, "f": fraction(m)} for m in ordered], target, "f")
    if block is not None and fraction(next(m for m in ordered if m.block_size == block)) < target:
        block = None  # floor_of's fallback: no size reaches the target
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
    views = bool(result.windowed)
    lines = [
        f"storage under {result.source}: {result.files} files, {_size(result.data_bytes)}; "
        f"{mode} reads at queue depth 1"
        + (f", and as the views read (WILLNEED on windows of {_size(result.window_bytes)} of blocks, "
           "ascending buffered preads)" if views else ""),
        "",
    ]
    qd1 = {m.block_size: m for m in result.random}
    win = {m.block_size: m for m in result.windowed}
    rows = [["read", "reads", "MB/s", "of sequential"] + (["views MB/s", "of sequential"] if views else []) + [""]]
    for b in sorted(set(qd1) | set(win)):
        q, w = qd1.get(b), win.get(b)
        row = [f"random {_size(b)}", str(q.reads) if q else "-", f"{q.mb_per_s:.1f}" if q else "-",
               f"{result.fraction(q):.2f}" if q else "-"]
        if views:
            row += [f"{w.mb_per_s:.1f}" if w else "-", f"{result.window_fraction(w):.2f}" if w else "-"]
        rows.append(row + ["<- recommended" if b == advice.block_size else ""])
    s = result.sequential
    row = ["sequential", str(s.reads), f"{s.mb_per_s:.1f}", "1.00"]
    if views:
        bs = result.buffered_sequential
        row += [f"{bs.mb_per_s:.1f}" if bs else "-", "1.00"]
    rows.append(row + [f"({_size(s.block_size)} O_DIRECT" + ("; 1 MiB buffered)" if views else ")")])
    lines += aligned(rows)
    lines.append("")
    depth = "at the views' depth" if views else "at queue depth 1"
    reach = (f"the smallest reaching {advice.target:.0%} of sequential throughput {depth}, with the next size "
             "and 3/4 of the larger ones"
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


__all__ = ["BLOCK_SIZES", "Advice", "AdviseError", "Measurement", "ProbeResult", "aligned", "data_files",
           "format_report", "measured_block_floor", "probe", "recommend"]
