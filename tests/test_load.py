"""Mounted load: 32 readers while the epoch flips every few milliseconds.  Every whole read is
exactly one epoch's permutation of the records (a handle keeps the epoch it opened with), no read
fails, and the daemon's peak memory (VmHWM) stays within the documented bound: 16 bytes per
record + 3 windows + 100 MiB.  ``--stress`` runs longer and more strategies."""

from __future__ import annotations

import collections
import threading
import time

import pytest

N = 400_000
DATA = b"".join(b'{"i": %06d, "p": "%s"}\n' % (i, b"x" * (i % 40)) for i in range(N))
BUFFER = 8 << 20
READERS = 32


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def strategies(stress: bool) -> list[str]:
    return ["corgipile", "block", "none"] if stress else ["corgipile"]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_readers_during_epoch_flips_get_whole_epochs_within_the_memory_bound(mount, stress, which):
    names = strategies(stress)
    if which >= len(names):
        pytest.skip("long version only (--stress)")
    strategy = names[which]
    m = mount({"a.jsonl": DATA}, "--strategy", strategy, "--buffer", str(BUFFER))
    expect = collections.Counter(DATA.splitlines())
    stop = time.monotonic() + (20 if stress else 3)
    problems: list[str] = []
    done = [0]

    def flip() -> None:
        e = 0
        while time.monotonic() < stop:
            e += 1
            m.set_epoch(e % 1000)
            time.sleep(0.003)

    def reader() -> None:
        while time.monotonic() < stop and not problems:
            try:
                with open(m.path("a.jsonl"), "rb") as f:
                    got = f.read()
            except OSError as e:
                problems.append(f"read failed: {e}")
                return
            if collections.Counter(got.splitlines()) != expect:
                problems.append("a whole read was not one permutation of the records")
                return
            done[0] += 1

    threads = [threading.Thread(target=flip)] + [threading.Thread(target=reader) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems[:3]
    assert done[0] >= READERS
    window = min(BUFFER, len(DATA))
    bound = 16 * N + 3 * window + (100 << 20)
    peak = vm_hwm(m.pid)
    assert peak <= bound, f"{strategy}: VmHWM {peak >> 20} MiB over the bound {bound >> 20} MiB"
