"""First epochs of later mounts of the Parquet file (`parquet_views`): each mount takes the copy
the mount before kept at its unmount, and reads one epoch, paired with a read of the source in
the same cache state.

Three cases: at an epoch no mount staged, read at once (the stage written between the mount and
the first read, or at the open); the same, read after a job's start-up (a child process that
imports torch, between the mount and the first open, as a training script does before its
first batch: the stage of the file the mount before read is written meanwhile,
[views-parquet-mount-start]); and at the epoch after the one the mount before read, whose stage
that mount built and kept.  A job's start-up is not in either read's time: the source's read
comes after the same start-up, and the start-up's own time beside the mount's build and beside
nothing is reported apart."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .parquet_peers import label_mix
from .proc import FuseDaemon, Sampler, can_drop_caches, drop_caches

LATER_ROUNDS = 7
"""First epochs of later mounts measured per cache state (`later_rounds`), and blocks of cold
epochs after one in a mount (`parquet_views.cold_epochs`).  Single cold epochs scatter widely on
the 2-core VM of these runs (0.29-1.00x of the source in alternated runs of one code): with 3 a
row's median moved between 0.48x and 1.00x from one run to the next."""
RESUMED = "the epoch after the one the mount before read, whose stage that mount built and kept"
NEW_EPOCH = "an epoch no mount staged"
STARTED = "an epoch no mount staged, read after a job's start-up"
STARTUP = [sys.executable, "-c", "import torch"]
"""A job's start-up between the mount and its first read (the case is left out where torch is
not installed)."""

BUILD = "the mount's build"
Iterate = Callable[..., tuple[int, float, np.ndarray]]
"""``iter_batches`` over a path (`parquet_views.iterate`): rows, seconds, labels; the seconds to
the first batch appended to a list passed second."""


def startup() -> float | None:
    """Seconds a job's start-up (`STARTUP`) took, or None if it cannot run here."""
    t0 = time.perf_counter()
    done = subprocess.run(STARTUP, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0 if done.returncode == 0 else None


def later_rounds(cmd: list[str], mnt: Path, view: Path, src: Path, log: Path, env: dict, rows: int,
                 iterate: Iterate, rounds: int = LATER_ROUNDS
                 ) -> tuple[dict[str, list[tuple]], dict[str, list[float]], list[str]]:
    """The first epochs of later mounts (module docstring), warm and cold (the page cache dropped
    before each, where this process may drop it: before the read, or before the mount and the
    start-up where there is one), the chain of `RESUMED` mounts each staying until the next
    epoch's stage, built while its epoch is read, is done, as a training epoch outlasts it.  Per
    (case, state), per round: (view rows/s, source rows/s, daemon usage, label mix); per (case,
    state), the seconds from each view's open to its first batch; and lines on the start-ups."""
    states = ["warm (the kept copy in the page cache)"]
    if can_drop_caches():
        states.append("cold (the page cache dropped before it and before the source read it is paired with: "
                      "the kept copy read from disk)")
    got: dict[str, list[tuple]] = {}
    firsts: dict[str, list[float]] = {}
    beside: dict[str, list[float]] = {BUILD: [], "nothing": []}
    first = int(time.time()) % 10**6 * 1000  # epochs of no run before (stages stay kept from run to run)
    chain = first + 500
    cases = [NEW_EPOCH, RESUMED] + ([STARTED] if importlib.util.find_spec("torch") is not None else [])
    for which in cases:
        if which == RESUMED:  # the first of the chain, not measured
            later_mount(cmd, mnt, view, log, env, chain, False, True, iterate)
        for i in range(rounds):
            for j, state in enumerate(states):
                cold = state.startswith("cold")
                if cold:
                    drop_caches()
                if which == STARTED:
                    beside["nothing"].append(startup() or 0.0)
                n, t, _ = iterate(src)
                base = n / t
                chain += 1
                epoch = chain if which == RESUMED else first + (0 if which == NEW_EPOCH else 5) + 10 * (
                    i * len(states) + j)  # never the one after another's
                opened: list[float] = []
                n, t, usage, labels, kept, took = later_mount(cmd, mnt, view, log, env, epoch, cold, which == RESUMED,
                                                              lambda p: iterate(p, opened), which == STARTED)
                assert n == rows and kept == (which == RESUMED), (which, epoch, kept)
                if took is not None:
                    beside[BUILD].append(took)
                if which == STARTED:
                    state = state.replace("dropped before it", "dropped before the mount")
                got.setdefault(f"at {which}, {state}", []).append((n / t, base, usage, label_mix(labels)[0]))
                firsts.setdefault(f"at {which}, {state}", []).extend(opened)
    notes = []
    if beside["nothing"]:
        notes.append(f"- A job's start-up (`{STARTUP[-1]}` in a child process, between the mount and "
                     f"the first open): median {np.median(beside['nothing']):.2f} s alone, "
                     f"{np.median(beside[BUILD]):.2f} s beside the stage the mount "
                     "started; not in either read's time.")
    return got, firsts, notes


def later_mount(cmd: list[str], mnt: Path, view: Path, log: Path, env: dict, epoch: int, cold: bool,
                linger: bool, iterate: Iterate, start_up: bool = False
                ) -> tuple[int, float, object, np.ndarray, bool, float | None]:
    """A mount at ``epoch`` that reads it once (after dropping the page cache if ``cold``: before
    the mount if ``start_up``, else before the read), which took the copy the mount before kept;
    ``start_up``: a job's start-up between the mount and the read; ``linger``: unmounted only
    once the stage built ahead is done.  (rows, seconds, daemon usage, labels, whether the
    epoch's stage was found kept, the start-up's seconds)."""
    if cold and start_up:
        drop_caches()
    with FuseDaemon([*cmd, "--epoch", str(epoch)], mnt, log, env) as d:
        took = startup() if start_up else None
        if cold and not start_up:
            drop_caches()
        with Sampler(d.pid) as s:
            n, t, labels = iterate(view)
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        deadline = time.monotonic() + 120
        while linger and stats["passthrough"].get("building_ahead") and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
    copies = stats["parquet_copies"]["copies"]
    assert all(c.get("made") == "by an earlier mount" for c in copies.values()), copies
    return n, t, s.usage, labels, bool(stats["passthrough"].get("stages_kept")), took
