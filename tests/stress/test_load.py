"""Level: stress (a short run by default, the long one with ``--stress``).

32 readers while the epoch flips every few milliseconds, all starting at once (most read the same
epochs) or one after another (each reads its own epoch: 32 plans and windows wanted at once).
Every whole read is exactly one epoch's permutation of the records (a handle keeps the epoch it
opened with), no read fails, and the daemon's own memory (anonymous + shared, sampled every
millisecond) stays within the documented bound: 16 bytes per record + 3 windows + 100 MiB (a
window build's working memory counts as the spare window, or beyond it if it takes more than a
window); its VmHWM, which also counts the source pages record-level views map, within the bound
plus the source file (one mapping, however many epochs are read at once).  pls is soaked as
whole-file and rank shares, unstaged and staged (``--stage-dir``: stage builds run beside the
plans and windows).  And 64 readers of a ``--direct-io`` mount wanting far more windows than fit:
they wait for memory in line, none times out.  ``--stress`` runs longer and more strategies."""

from __future__ import annotations

import collections
import errno
import random
import threading
import time

import sys
from pathlib import Path

import numpy as np
import pytest

from shufflefs.formats import make_format, scan_file
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.units import share_edges
from shufflefs.windows.view import window_work

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench.lines import HEAD, MID, TAIL, numbered_lines, permutation_check  # noqa: E402

N = 400_000
DATA = numbered_lines(N, 6, 40)
is_permutation = permutation_check(N, 6, 40)
BUFFER = 8 << 20
READERS = 32


def test_the_permutation_check_catches_damage():
    lines = DATA.splitlines(keepends=True)
    assert is_permutation(b"".join(reversed(lines)))
    bad = bytearray(b"".join(reversed(lines)))
    bad[1000] ^= 1
    assert not is_permutation(bytes(bad))
    assert not is_permutation(b"".join(lines[1:] + lines[:1][:0] + lines[2:3]))


def share_check(rank: int, world: int):
    """A test that bytes are ``rank``'s share of some epoch: as many distinct, intact lines as a
    share holds (which records an epoch gives the rank is the exchange tests' business)."""
    count = int(np.diff(share_edges(N, world))[rank])
    digits, spread = 6, 40
    base = len(HEAD) + digits + len(MID) + len(TAIL)
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)

    def check(data: bytes) -> bool:
        b = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(b == 10)
        if len(ends) != count or len(b) == 0 or b[-1] != 10:
            return False
        starts = np.concatenate(([0], ends[:-1] + 1))
        if np.any(ends - starts + 1 < base):
            return False
        ids = ((b[starts[:, None] + np.arange(len(HEAD), len(HEAD) + digits)].astype(np.int64) - 48) * powers).sum(axis=1)
        return bool(len(np.unique(ids)) == count and ids.min() >= 0 and ids.max() < N
                    and np.array_equal(ends - starts + 1, base + ids % spread)
                    and np.count_nonzero(b == ord("x")) == int((ids % spread).sum()))

    return check


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def file_pages(pid: int) -> int:
    """RssFile: the file pages the daemon maps (its libraries, the source of record-level views)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


def own_memory(pid: int) -> int:
    """RssAnon + RssShmem: the daemon's memory without the file pages it maps."""
    total = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


PLS_RANKS = {"one": (0, 1), "two": (1, 2), "four": (3, 4)}
"""pls mounts: the rank shares soaked (rank, world), each also with ``--stage-dir``."""


def runs(stress: bool) -> list[tuple[str, float, str, bool]]:
    """(strategy, ms between reader starts, pls rank share, staged)."""
    if stress:
        return [(s, ms, "one", False) for s in ("corgipile", "block", "none", "full", "window") for ms in (0.0, 20.0)] \
            + [("pls", ms, r, staged) for r in PLS_RANKS for staged in (False, True) for ms in (0.0, 20.0)]
    return [("corgipile", 0.0, "one", False), ("full", 20.0, "one", False), ("pls", 0.0, "one", True),
            ("pls", 20.0, "two", True)]


@pytest.mark.parametrize("which", range(22))
def test_readers_during_epoch_flips_get_whole_epochs_within_the_memory_bound(mount, stress, which, tmp_path):
    """Holds: SEMANTICS.md#memory-bound, SEMANTICS.md#reads-whole-epoch"""
    chosen = runs(stress)
    if which >= len(chosen):
        pytest.skip("long version only (--stress)")
    strategy, stagger_ms, share, staged = chosen[which]
    rank, world = PLS_RANKS[share]
    args = ["--strategy", strategy, "--buffer", str(BUFFER)]
    if strategy == "pls":
        args += ["--rank", str(rank), "--world-size", str(world), "--exchange", "0.2"]
        if staged:
            args += ["--stage-dir", str(tmp_path / "stage")]
    m = mount({"a.jsonl": DATA}, *args)
    # a rank's whole read is its share of one epoch's records (a permutation of them)
    check = is_permutation if world == 1 else share_check(rank, world)
    stop = time.monotonic() + (20 if stress else 3)
    problems: list[str] = []
    done = [0]

    def flip() -> None:
        e = 0
        while time.monotonic() < stop:
            e += 1
            m.set_epoch(e % 1000)
            time.sleep(0.003)

    def reader(i: int) -> None:
        time.sleep(i * stagger_ms / 1000)
        while time.monotonic() < stop and not problems:
            try:
                with open(m.path("a.jsonl"), "rb") as f:
                    got = f.read()
            except OSError as e:
                problems.append(f"read failed: {e}")
                return
            if not check(got):
                problems.append("a whole read was not one epoch's permutation of the records")
                return
            done[0] += 1

    own = [0]

    def sample() -> None:
        while time.monotonic() < stop:
            own[0] = max(own[0], own_memory(m.pid))
            time.sleep(0.001)

    threads = [threading.Thread(target=flip), threading.Thread(target=sample)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems[:3]
    assert done[0] >= READERS
    window = min(BUFFER, len(DATA))
    copy = tmp_path / "bound"
    copy.mkdir()
    (copy / "a.jsonl").write_bytes(DATA)
    index = scan_file(copy / "a.jsonl", make_format("lines"))
    spec = ShuffleSpec(strategy=strategy, buffer=BUFFER, exchange=0.2 if strategy == "pls" else 0.0)
    work = window_work(make_plan(index, spec, 0, rank, world))
    bound = 16 * N + 3 * window + max(0, work - window) + (100 << 20)
    own[0] = max(own[0], own_memory(m.pid))
    what = f"{strategy} (readers {stagger_ms} ms apart, rank {rank} of {world}{', staged' if staged else ''})"
    assert own[0] <= bound, f"{what}: {own[0] >> 20} MiB over the bound {bound >> 20} MiB"
    peak = vm_hwm(m.pid)  # views of every epoch share one mapping of the file (`SourceFile.mapping`)
    assert peak <= bound + len(DATA), \
        f"{what}: VmHWM {peak >> 20} MiB over the bound and the file (own memory at most {own[0] >> 20} MiB, " \
        f"file pages now {file_pages(m.pid) >> 20} MiB)"


def test_64_direct_io_readers_across_epochs_wait_their_turn_and_never_time_out(mount, stress):
    """64 readers of four files of a ``--direct-io`` mount (every read reaches the daemon) while
    the epoch moves every 50 ms: many more windows wanted at once than fit in memory, so reads wait
    for room, in line.  No read fails and every whole read is one epoch's records.  Before reads
    waited in line, a handle that let go of its window took the memory back for its next one:
    180 s of this gave 100 reads ETIMEDOUT of 1,000, each logged as a hung source.
    Holds: SEMANTICS.md#memory-fair"""
    n = 200_000
    data = numbered_lines(n, 6, 40)
    check = permutation_check(n, 6, 40)
    names = [f"f{i}.jsonl" for i in range(4)]
    m = mount({name: data for name in names}, "--buffer", "4MiB", "--direct-io")
    stop = time.monotonic() + (180 if stress else 10)
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def reader(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < stop:
            try:
                with open(m.path(rng.choice(names)), "rb", buffering=0) as f:
                    got = b"".join(iter(lambda: f.read(1 << 20), b""))
                what = "whole" if check(got) else "not one epoch's records"
            except OSError as e:
                what = errno.errorcode.get(e.errno, str(e.errno))
            with lock:
                counts[what] += 1

    def flip() -> None:
        e = 0
        while time.monotonic() < stop:
            e += 1
            m.set_epoch(e)
            time.sleep(0.05)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(64)] + [threading.Thread(target=flip)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(counts) == {"whole"}, dict(counts)
    assert "no memory for" not in m.stderr() and "source hung" not in m.stderr()
