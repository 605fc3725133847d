"""One shuffled view of one source file for one epoch: blocking I/O, run from worker threads.

A `View` owns no FUSE state; the filesystem layer calls `load_window` from a thread and slices
the result.  Every load checks the source against the stamp its index was built from (before
and after reading), so a file changed or removed while mounted yields `StaleSourceError`
instead of bytes that mix two versions.

A window load (`View.load_window`) is one compiled call that holds no GIL.  A window of long
runs (block orders, `none`) is built by `_gather.build_window`: one pass over the window's runs
in ascending source order, reading `READ_CHUNK` bytes at a time into a small scratch buffer and
copying each record of the chunk to its place in the window while the chunk is still in the CPU
cache.  A window of short runs (record-level and page orders, `MAP_RUN`) is copied record by
record in view order from a read-only mapping of the source (`_gather.gather_mapped`): no
system call, sort or run per record.  Without the compiled module,
`layout.assemble` does the same work (all runs into a window-sized scratch, then a numpy
gather), several times slower.  For a sequential reader the load then asks the kernel to read
the next window's blocks into the page cache (``POSIX_FADV_WILLNEED``), so that a cold disk
works on them while this window is served and the next load starts.
"""

from __future__ import annotations

import mmap
from typing import Callable

import numpy as np

from ..formats.base import FramingError, WindowCheck
from ..formats.framing import TAR, FramingCheck, raise_framing
from ..formats.npy import Columns
from ..index.table import RecordIndex
from .edges import check_detached, fd_edges, load_checked
from .layout import Layout, assemble, id_runs
from ..sources.base import Members, Source, take_requests
from ..sources import direct
from ..sources.cache_mode import SourceCache
from ..sources.local import SourceFile
from .build import added_newlines, build_runs, direct_window
from .build import gather_members as _gather_members

try:
    from .._gather import build_window as _build_window  # compiled at install time; optional
    from .._gather import cached_pages as _cached_pages
    from .._gather import gather_mapped as _gather_mapped
except ImportError:  # pragma: no cover - depends on the build (or an older build of it)
    _build_window = _gather_mapped = _cached_pages = None
from ..strategies.base import Plan
from .transposed import load_columns

GATHER = "compiled" if _build_window is not None else "numpy"
"""Which window build serves: ``numpy`` (several times slower) means the compiled module
``shufflefs/_gather.c`` was not built or not found (shown by ``shufflefs stat``, warned at mount)."""

PAGE = mmap.PAGESIZE
READ_CHUNK = 1 << 20
"""Scratch bytes read at once while building a window (a chunk ends at a record boundary).
Measured on a 2-core EPYC VM (1 MiB L2 per core) building 64 MiB corgipile windows of ~1 KiB
records from the page cache (CPU time, three runs of five interleaved rounds): 512 KiB - 2 MiB
chunks 5.0-5.2 GB/s, 4 MiB (one read per block) 4.8-5.0, 128 KiB 4.5-4.7.  A whole load (ids,
runs, build) runs at 3.7-3.9 GB/s; the previous design (read all of the window's runs into a
window-sized scratch, sort, then gather) at 1.7-2.4 GB/s."""
RECORD_CHUNK = 1 << 17
"""Records built per pass of a sparse record-level window (``full``, ``lirs``... over a file much
larger than the window), so that the build's working arrays (`LOAD_WORK_RECORDS` bytes per
record: ids, runs, files, shifts, view positions) stay near 7 MB instead of growing with the
window: a 64 MiB window of 50-byte records took 70 MB more than the window itself.  Each pass
reads its records in ascending order.  A dense window is built in one pass, whose sorted ids
merge into long runs: on a 2-core VM (64 MiB window of 50-byte records, 91% of the file's
records) one pass took 0.5-0.6 s, passes of 2**17 records 1.4-1.6 s (a pread per record)."""
MAP_RUN = 64 << 10
"""Windows whose runs average fewer bytes than this are copied in view order from read-only
mappings of the source files (`Source.mapped_members`) instead of read by one pread per run:
record-level orders (``full``, ``once``, ``window``, ``lirs``) and page orders (``lirs-page``).
Block orders keep large preads, which the kernel's readahead serves best cold.

Measured on the 2-core VM (2 GiB of ~1 KiB JSON lines, warm, 64 MiB windows, 1 MiB reads of the
mounted view, median of three epochs, two alternating rounds; ``none`` read 2.2-3.4 GB/s in the
same runs): ``full`` 0.57-0.59 GB/s with a pread per run, 1.0-1.3 copying runs from a mapping
in source order (prefetching a later run's lines), 1.76-1.82 copying in view order; ``window``
0.80 -> 1.3 -> 1.7-2.4; ``lirs-page`` 1.0 -> 1.2-1.4 -> 1.7-1.8.  Building the halves of a
window on two threads at once gained 10-30% in one process but lost 10-15% through the mount,
where the FUSE thread and the reader need the second core.  Copying with cache-bypassing
(streaming) stores made every load 1.5-3x slower on this VM.  A ``corgipile`` window copied from
a mapping loaded no faster than by preads (3.3-3.6 GB/s both, in one process)."""
CACHED = 0.95
"""A window is copied from mappings only while at least this share of the source's pages is in
the page cache (`_cached`: one cachestat(2) per file and window); otherwise it is read by
preads, as cold windows always were.  Faults on a mapping read one page each (``MADV_RANDOM``;
without it the kernel's read-around of megabytes per fault was worse still) and mapped pages are
slow to reclaim: with the daemon and reader in a 640 MiB memory cgroup over a 2 GiB file
(`tools/lirs_penalty.py`), ``full`` read 0.011-0.012 GB/s and ``lirs-page`` 0.029-0.032 copying
from the mapping, against 0.071 and 0.058 by preads (without ``MADV_RANDOM``: 1 MB in 20 s)."""
SPARSE = 0.25
"""Windows holding less than this share of their index's records are built in passes."""
LOAD_WORK_RUNS, LOAD_WORK_RECORDS = 24, 56
"""Working bytes per record of a window build besides the window, counted in the memory limit
while the load runs (`window_work`): a window of runs holds its ids twice (the plan's, int64 for
the build) and every record's view position; a record-level window also holds its runs (first,
count, file, shift), about one per record in a sparse window."""
HINT_RUN = MAP_RUN
"""Runs at least this long always get the readahead hint (shorter ones only while the source is
cold, below), so that the blocks of a block order are all in flight at once: the automatic block
is 128 KiB or more.  Measured (2026-11-25, `tools/cold_io.py`, retired, in git at 62680a3; 8 GiB file, page cache dropped,
64 MiB of random blocks, MB/s over a sequential read's): 128 KiB blocks read by 1 MiB preads one
at a time 892 (0.91), with WILLNEED on the window's blocks first 2,086 (2.12), 32 threads 1,272,
io_uring at depth 64 1,836; 64 KiB 403 / 1,370; 1 MiB 1,331 / 2,534.  With hints only for runs
of 2 MiB and more (as before), a 128 KiB block order read cold at the one-at-a-time rate.  A hint
of cached pages costs ~2 us (512 per 64 MiB window of 128 KiB blocks: ~1 ms against a ~17 ms
load).

Measured before on the same VM, cold page cache, 512 MiB of corgipile windows (4 MiB blocks)
loaded back to back, median of six rounds: hinting the next window after each load 1.26 GB/s,
hinting each window's own blocks before reading them 1.13, no hint 1.14: on that virtual disk a
deeper queue alone gained nothing, overlapping disk time with the copying did.

Measured again (2026-11-25, same VM, virtio disk with 8 MiB readahead; `tools/cold_io.py`, retired, in git at 62680a3; 2 GiB
file, page cache dropped, median of 2 rounds) for reading a block shuffle's windows at a deeper
queue: 4 MiB blocks, windows of 64 MiB: 1 MiB preads one at a time 1.63 GB/s, WILLNEED on the
next window after each 2.12, WILLNEED on each window's own blocks first 2.08, 1/2/4/8 threads
preading whole blocks (this window's and the next's) 1.51/1.87/1.91/1.97, against a sequential
read of the file at 1.78 (rounds of 2.54 and 1.03; `dd` cold 0.69-3.2 GB/s in three runs);
16 MiB blocks: hint-next 2.46, 4 threads 2.31, sequential 2.04 (2.77 and 1.31).  Loading every
window of a 2 GiB corgipile view in one process: warm 4.0-4.1 GB/s, cold with the next-window hint
1.6-1.9, with hints two windows ahead 1.6-1.7, with POSIX_FADV_RANDOM and exact hints 1.4-1.9.
So the kernel's readahead fed by hints reaches the disk's rate for random blocks, and threads add
nothing but memory; a window's own blocks are hinted too, so that window 0 (and a reader who
jumps) is not read one request at a time.

Short runs are hinted too while the source is cold (the last load found it mostly outside the
page cache, `CACHED`): a page order (``lirs-page``) reads a page per run, one request at a time
by preads, and hinting all of a window's pages (~16,000 fadvise calls for 64 MiB, 0.2 s) puts
them in flight at once.  Measured (2026-11-25, 2 GiB of ~1 KiB JSON lines, 64 MiB windows): loading
``lirs-page`` windows one after another in one process after dropping the page cache, 0.11 GB/s
-> 0.25; through a mount with the daemon and reader in a 640 MiB memory cgroup
(`tools/lirs_penalty.py`), 0.058 -> 0.21-0.23 GB/s (``full`` 0.055, ``corgipile`` 1.18).  Warm,
they would cost that time for nothing, so they are not sent then."""


def resident(members: Members) -> float:
    """The share of the mapped files' pages in the page cache (one cachestat(2) per file)."""
    cached = total = 0
    slots, at = np.unique(members.slot, return_index=True)  # a file once, however many members map it
    for m in at[slots >= 0].tolist():
        mapped = members.maps[int(members.slot[m])]
        cached += _cached_pages(int(members.fd[m]), mapped)
        total += -(-len(mapped) // PAGE)
    return cached / total if total else 1.0


def _cached(members: Members) -> bool:
    """Whether at least `CACHED` of the mapped files' pages are in the page cache."""
    return resident(members) >= CACHED


def gather_members(*args: object, **kw: object) -> np.ndarray:
    """`build.gather_members` by this module's compiled gather (which tests may replace)."""
    return _gather_members(*args, gather=_gather_mapped, **kw)


Meter = Callable[..., None]
"""Told ``(bytes from the source, bytes from a local stage[, sources.base.Fetched])`` of each
window built: record bytes, and what a remote source's requests cost."""


def _sparse(plan: Plan, records: int) -> bool:
    return records < SPARSE * plan.index.n


def window_work(plan: Plan, k: int | None = None) -> int:
    """Bytes a load of window k works with besides the window (an estimate, see
    `LOAD_WORK_RUNS`); None: the most any window of the plan needs."""
    sizes = np.asarray(plan.window_records)
    if len(sizes) == 0:
        return 0
    records = int(sizes[k] if k is not None else sizes.max())
    if plan.window_runs(k if k is not None else int(np.argmax(sizes))) is not None:
        return LOAD_WORK_RUNS * records
    if _sparse(plan, records):
        return LOAD_WORK_RECORDS * min(records, RECORD_CHUNK)
    # a dense random window: a record starts a run when the one before it is not in the window
    runs = records * (1 - records / max(plan.index.n, 1)) + 1
    return int(LOAD_WORK_RUNS * records + (LOAD_WORK_RECORDS - LOAD_WORK_RUNS) * runs)


class View:
    """Layout + source for one (file, epoch): turns window numbers into bytes.

    A shard of a pool passes its ``source`` (the pool's files, shared) and ``frame`` (the
    header and trailer bytes it shows); a staged view passes a `stages.stage_file.StagedSource`; a single
    file opens its own source and reads its header and trailer from it."""

    def __init__(self, path: str, index: RecordIndex, plan: Plan, source: Source | None = None,
                 frame: tuple[bytes, bytes] | None = None, meter: Meter | None = None,
                 check: WindowCheck | None = None, distrust: Callable[[RecordIndex], None] | None = None,
                 columns: Columns | None = None, source_cache: SourceCache | None = None) -> None:
        """``columns``: the rows are strided (a Fortran-order ``.npy``), gathered by
        `transposed.load_columns`; ``frame`` must then carry the C-order header.
        ``source_cache``: the mount's choice whether a window's source pages are dropped once it
        is built (`sources.cache_mode`); None keeps them."""
        self.path = path
        self.columns = columns
        self.check = check
        # the framing check the compiled gather runs as it copies (then only `full` after it)
        self._framing = check.code if isinstance(check, FramingCheck) else 0
        self._tar = isinstance(check, FramingCheck) and check.kind == "tar"
        self.distrust = distrust  # told of an index a window check found wrong
        self.index = index
        self.plan = plan
        self.meter = meter
        own = source is None
        if own:
            if index.stamp is None:
                raise ValueError("a mounted view needs an index with a source stamp")
            source = SourceFile(path, index.stamp)
        self.source: Source = source
        try:
            if frame is None:
                frame = (source.read_range(0, index.header_end), source.read_range(index.trailer_start, index.size))
        except BaseException:
            if own:
                source.close()
            raise
        self.header, self.trailer = frame
        self.layout = Layout(index, plan, len(self.header), len(self.trailer))
        self._runs_memo: tuple[Plan, int, tuple[np.ndarray, np.ndarray] | None] | None = None
        self._members: Members | None | bool = False  # False: not asked yet
        none = np.zeros(0, np.int64)  # a source without descriptors places nothing (`Source.place`)
        self._cold = False  # the last load found the source cold (short runs are hinted then)
        self._gathered = _build_window is not None and source.place(index, none, none) is not None
        self._source_cache = source_cache
        mode = "keep"
        if source_cache is not None and columns is None and hasattr(source, "drop"):
            mode = source_cache.decide(int(index.bounds[-1] - index.bounds[0]), self._resident,
                                       direct=self._gathered and not self._tar and isinstance(source, SourceFile))
        self.drop_behind = mode == "drop"
        self.direct = mode == "direct"
        self._direct: direct.DirectReader | None = None

    @property
    def size(self) -> int:
        return self.layout.size

    def load_window(self, k: int, out: np.ndarray | None = None, scratch: np.ndarray | None = None,
                    ahead: bool = False, plan: Plan | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Window k's bytes, built in ``out`` if it is large enough (blocking); ``ahead``: then
        hint the next window's blocks (for a sequential reader).  ``plan``: window k of that plan
        over the same index instead (a shard loads its pool stream's windows).

        Returns ``(window, scratch)``: the scratch buffer used, for the caller to reuse.  Reusing
        both buffers across loads avoids first-touching fresh memory for every window.
        """
        self.source.check()
        plan = self.plan if plan is None else plan
        if self.columns is not None:
            return self._load_columns(k, plan, out), scratch
        runs = self._runs(plan, k)
        size = self.layout.window_size(k) if plan is self.plan else int(plan.window_sizes[k])
        ids = plan.window(k)
        if out is None or len(out) < size:
            out = np.empty(size, np.uint8)
        if not self._gathered:
            # no compiled gather, or a source without descriptors: all runs in one call
            self._advise(runs)
            take_requests()
            window = self._assemble(ids, out)
            if self.meter is not None:
                self.meter(len(window), 0, take_requests())
            return window, scratch
        if scratch is None:
            scratch = np.empty(READ_CHUNK, np.uint8)
        # short runs on average (a window's bytes are about its size): copied from a mapping
        mapped = size < MAP_RUN * (len(runs[0]) if runs is not None else max(len(ids), 1))
        members = self._mapped_members() if mapped else None
        self._cold = members is not None and not _cached(members)
        if self._cold:
            members = None  # a cold source: preads (see `CACHED`)
        cache = self._source_cache
        if (self.direct and runs is not None and members is None and cache.direct_for(size, len(runs[0]))
                and self._resident() < CACHED):
            try:
                window = self._load_direct(ids, runs, out)  # no hints: they would fill the page cache
            except direct.Unsupported:  # no O_DIRECT on this filesystem: buffered, pages dropped
                self.direct, self.drop_behind = False, True
            else:
                cache.loaded("direct")
                if self.meter is not None:
                    self.meter(len(window) - added_newlines(self.index.newline_ids, ids), 0)
                return window, scratch
        # this window's runs all in flight at once (only window 0 is not yet), short ones too if cold
        self._advise(runs, every=self._cold)
        # copied in view order from mappings: no working arrays, one pass; else runs, in passes
        sparse = runs is None and members is None and _sparse(plan, len(ids))
        step = RECORD_CHUNK if sparse else max(len(ids), 1)
        pos, remote, local_bytes = 0, 0, 0
        report = np.empty(2, np.int64)
        for lo in range(0, max(len(ids), 1), step):
            part = ids[lo: lo + step]
            part_runs = runs if step >= len(ids) else None
            built, r, loc = self._build_part(out[pos:], scratch, part, part_runs, members, report)
            if self._framing:
                self._framed(report)
            pos, remote, local_bytes = pos + built, remote + r, local_bytes + loc
        window = out[:pos]
        self._check(window, ids, framed=bool(self._framing))
        if self._source_cache is not None:
            self._source_cache.loaded("buffered")
        if (self.drop_behind or self.direct) and runs is not None and members is None:
            self._drop(runs)  # a direct view's window of long runs, read buffered
        if self.meter is not None:
            self.meter(remote, local_bytes)
        if ahead and k + 1 < plan.n_windows:
            self.hint(k + 1, plan)
        return window, scratch

    def _assemble(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Window ``ids`` from ``read_runs``, checked; a tar window with its samples' neighbours
        fetched in the same requests (`edges.load_checked`)."""
        if not self._tar:
            window = assemble(self.index, ids, self.source.read_runs, out, getattr(self.source, "stepwise", False))
            self._check(window, ids)
            return window
        try:
            window = load_checked(self.index, ids, self.source, out, self.path)
        except FramingError as e:
            self._failed(e)
        self._check(window, ids, framed=True)
        return window

    def _load_columns(self, k: int, plan: Plan, out: np.ndarray | None) -> np.ndarray:
        """Window k of an array whose rows are strided, from its columns (no hints, no stage)."""
        ids = np.asarray(plan.window(k), np.int64)
        size = len(ids) * self.columns.itemsize * self.columns.count
        if out is None or len(out) < size:
            out = np.empty(size, np.uint8)
        take_requests()
        window = load_columns(self.source, self.index, self.columns, ids, out)
        self.source.verify_open()
        self._check(window, ids)
        if self.meter is not None:
            self.meter(len(window), 0, take_requests())
        return window

    def _check(self, window: np.ndarray, ids: np.ndarray, framed: bool = False) -> None:
        """The window check (`formats.base.gather_check`; ``framed``: the compiled gather checked
        the framing, the full check is left); a failure is `_failed`."""
        check = self.check
        if framed and isinstance(check, FramingCheck):
            check = check.full
        if check is None:
            return
        try:
            check(window, ids, self.index, self.path)
        except FramingError as e:
            self._failed(e)

    def _framed(self, report: np.ndarray) -> None:
        """The compiled gather's framing ``report`` (`_failed` if it found a record wrong)."""
        try:
            raise_framing(report, self.index, self.path)
        except FramingError as e:
            self._failed(e)

    def _failed(self, e: FramingError) -> None:
        """A window check found the index wrong: the error names the file the record is in (a
        pool's member), and ``distrust`` is told before it is raised."""
        locate = getattr(self.index, "locate", None)  # a pool: pooled offsets
        if locate is not None and e.offset is not None:
            m, off = locate(e.offset)
            files = getattr(self.source, "files", None)
            path = getattr(files[m], "path", None) if files is not None and m < len(files) else None
            e = FramingError(path or self.path, off, f"{e.message} (pool member {m}, read through {self.path})")
        if self.distrust is not None:
            self.distrust(self.index)
        raise e from None

    def _resident(self) -> float:
        """The share of the source's pages cached now (0 if it cannot be mapped)."""
        members = self._mapped_members()
        return resident(members) if members is not None and _cached_pages is not None else 0.0

    def _load_direct(self, ids: np.ndarray, runs: tuple[np.ndarray, np.ndarray], out: np.ndarray) -> np.ndarray:
        """Window ``ids`` read past the page cache (`build.direct_window`), checked as ever."""
        if self._direct is None:
            self._direct = direct.DirectReader(self.source)
        report = np.empty(2, np.int64)
        window = direct_window(self._direct, self.index, ids, runs, out, self.source, self._framing, report,
                               _gather_mapped)
        if self._framing:
            self._framed(report)
        self._check(window, ids, framed=bool(self._framing))
        return window

    def _drop(self, runs: tuple[np.ndarray, np.ndarray]) -> None:
        """The window's runs out of the page cache, now that it is built and verified: the view's
        pages keep its bytes (`sources.cache_mode`)."""
        self.source.drop(self.index, runs[0], runs[1])
        if self._source_cache is not None:
            b = self.index.bounds
            self._source_cache.dropped(int((b[runs[0] + runs[1]] - b[runs[0]]).sum()))

    def _mapped_members(self) -> Members | None:
        """The source's files as mappings (`Source.mapped_members`), asked once per view; None
        if it has none (a stage, a remote store, no compiled module)."""
        if self._members is False:
            ask = getattr(self.source, "mapped_members", None)
            self._members = ask() if ask is not None and _gather_mapped is not None else None
        return self._members

    def _build_part(self, out: np.ndarray, scratch: np.ndarray, part: np.ndarray,
                    runs: tuple[np.ndarray, np.ndarray] | None, members: Members | None,
                    report: np.ndarray) -> tuple[int, int, int]:
        """Records ``part`` (view order; ``runs``: the same as ascending runs, if known) built at
        the start of ``out``: ``(bytes built, of them from the source, from a local stage)``.
        With ``members``, copied in view order from the mappings (`gather_members`).  The
        framing check's first failure goes to ``report``."""
        newlines, framing = self.index.newline_ids, self._framing
        if members is not None:
            built = len(gather_members(out, self.index, part, members, self.source, framing, report))
        else:
            first, count = runs if runs is not None else id_runs(part)
            placed = self.source.place(self.index, first, count)
            edges = fd_edges(self.index, placed, self.source) if framing == TAR else None
            built = len(build_runs(out, scratch, self.index, part, placed, newlines, self.source.file_of, framing,
                                   report, edges and edges[0]))
            if edges is not None:  # a stage's source files, and runs whose files have no descriptor
                try:
                    check_detached(out[:built], part, self.index, edges, self.source, self.path, report)
                except FramingError as e:
                    self._failed(e)
        if self.meter is None:
            return built, 0, 0
        if members is not None or self.source.local_fd < 0:  # all from the source, less added newlines
            return built, built - added_newlines(newlines, part), 0
        nbytes, local = placed.nbytes(self.index.bounds), placed.fd == self.source.local_fd
        return built, int(nbytes[~local].sum()), int(nbytes[local].sum())

    def hint(self, k: int, plan: Plan | None = None) -> None:
        """Ask the kernel to read window k's long runs (every run while the source is cold) into
        the page cache (returns at once)."""
        if self.columns is not None:
            return  # the runs are of rows, not of the columns' bytes
        self._advise(self._runs(self.plan if plan is None else plan, k), every=self._cold)

    def _runs(self, plan: Plan, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``plan.window_runs(k)``, computed once for the hint of window k and its load (a page
        order's runs take an argsort per window).  One entry, replaced whole: loads of other
        windows on other threads only miss it."""
        memo = self._runs_memo
        if memo is not None and memo[0] is plan and memo[1] == k:
            return memo[2]
        runs = plan.window_runs(k)
        self._runs_memo = (plan, k, runs)
        return runs

    def _advise(self, runs: tuple[np.ndarray, np.ndarray] | None, every: bool = False) -> None:
        if runs is None:  # a record-level order: runs of a record or two, nothing to hint
            return
        if self.direct and self._source_cache.direct_for(int(self.index.bounds[runs[0] + runs[1]].sum()
                                                             - self.index.bounds[runs[0]].sum()), len(runs[0])):
            return  # read by O_DIRECT: a hint would only fill the page cache
        if every:
            self.source.advise(self.index, runs[0], runs[1])
            return
        b = self.index.bounds
        long = np.flatnonzero(b[runs[0] + runs[1]] - b[runs[0]] >= HINT_RUN)
        if len(long):
            self.source.advise(self.index, runs[0][long], runs[1][long])

    def close(self) -> None:
        self._members = None  # the mappings go with the source's last reference
        if self._direct is not None:
            self._direct.close()
        self.source.close()

