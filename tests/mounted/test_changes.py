"""Level: mounted (real FUSE mounts, real readers).

Mounted: source files changed under the mount (the change matrix).

Each change (append, truncate, a same-size rewrite with the mtime set back, replace by rename,
delete, rename away) meets a view in three states: open and being read, idle (read and closed
before the change, opened again after it) and after a remount with the same index cache.  Every
read must give bytes of exactly one version of the file (the old one before the change, else the
new one after a fresh open) or an errno; never bytes of two versions, never an index of the
old version over the new bytes.  The long version (``--stress``) runs every strategy.
"""

from __future__ import annotations

import collections
import errno
import os
from pathlib import Path
from typing import Callable

import pytest

OLD = b"".join(b'{"id": %06d, "v": "old"}\n' % i for i in range(6000))
STRATEGIES_SHORT = ["corgipile", "full"]
STRATEGIES_LONG = ["none", "once", "full", "lirs-page", "block", "corgipile", "window"]
ARGS = ["--block-size", "16KiB", "--buffer", "64KiB"]


def records(data: bytes) -> collections.Counter:
    return collections.Counter(data.splitlines(keepends=True))


def rewrite_same_size_same_mtime(path: Path) -> bytes:
    """New bytes of the same length, written in place, with the old mtime restored: only the
    ctime tells (the same lines in another order, so every line still parses)."""
    st = os.stat(path)
    lines = path.read_bytes().splitlines(keepends=True)
    new = b"".join(lines[1::2] + lines[0::2])
    assert len(new) == st.st_size and new != path.read_bytes()
    with open(path, "r+b") as f:
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == st.st_size
    return new


def append(path: Path) -> bytes:
    with open(path, "ab") as f:
        f.write(b'{"id": 999999, "v": "new"}\n')
    return path.read_bytes()


def truncate(path: Path) -> bytes:
    data = path.read_bytes()
    cut = data[: data.index(b"\n", len(data) // 2) + 1]
    os.truncate(path, len(cut))
    return cut


def replace(path: Path) -> bytes:
    new = OLD.replace(b"old", b"new")
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(new)
    os.replace(tmp, path)
    return new


def delete(path: Path) -> None:
    path.unlink()


def rename_away(path: Path) -> None:
    path.rename(path.with_name("moved.txt"))


CHANGES: dict[str, Callable[[Path], bytes | None]] = {
    "same-size-same-mtime": rewrite_same_size_same_mtime,
    "append": append,
    "truncate": truncate,
    "replace": replace,
    "delete": delete,
    "rename-away": rename_away,
}


def file_of_view(got: bytes, size: int) -> bytes:
    """The file a whole view of numbered records of ``size`` bytes was read from: its records in
    id order, then at most one cut record (the file ended inside it), which the view gives last
    as it is, without a newline (SEMANTICS.md#views-torn).  AssertionError if ``got`` holds a
    record twice, more than one cut record or one before other records."""
    lines = got.splitlines(keepends=True)
    whole = sorted((line for line in lines if len(line) == size and line.endswith(b"}\n")), key=lambda r: r[7:13])
    cut = [line for line in lines if not (len(line) == size and line.endswith(b"}\n"))]
    assert len({r[7:13] for r in whole}) == len(whole), "a record twice"
    assert len(cut) <= 1 and all(not line.endswith(b"\n") for line in cut), f"a damaged record: {cut[:2]}"
    assert not cut or lines[-1] is cut[0], "a cut record before other records"
    return b"".join(whole) + b"".join(cut)


def churn_state(got: bytes, old: bytes, new: bytes, cut: int) -> str:
    """Which state of a file that is cut to ``cut`` bytes and then written whole from offset 0
    (one version after the other) ``got`` is the view of: "whole" (old or new), "cut" (a version
    cut short) or "being written" (the next version's bytes from offset 0 over the cut one, or
    its prefix: a write may pause between pages, and the file is then that for a while).
    AssertionError naming the damage otherwise: never records of two versions but in these
    states, never a damaged or missing record."""
    data = file_of_view(got, old.index(b"\n") + 1)
    if len(data) >= cut and data in (old[:len(data)], new[:len(data)]):  # a prefix of one version
        return "whole" if len(data) == len(old) else "cut" if len(data) == cut else "being written"
    for this, other in ((old, new), (new, old)) if len(data) == cut else ():
        same = next((i for i, (a, b) in enumerate(zip(data, this)) if a != b), cut)
        if data[same:] == other[same:cut]:  # this written from offset 0 over the other, cut
            return "being written"
    raise AssertionError(f"records of two versions, or a record missing, in one read of {len(got)} bytes")


def read_all(path: Path) -> bytes | int:
    """The whole file, or the errno that stopped the read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return e.errno


def strategies(stress: bool) -> list[str]:
    return STRATEGIES_LONG if stress else STRATEGIES_SHORT


@pytest.mark.parametrize("change", CHANGES)
def test_an_open_view_never_mixes_versions(mount, stress, change):
    """Holds: SEMANTICS.md#changes-version, SEMANTICS.md#changes-open-estale, SEMANTICS.md#errors-estale"""
    for strategy in strategies(stress):
        m = mount({"a.jsonl": OLD}, "--strategy", strategy, *ARGS, name=f"open-{strategy}")
        src = m.src / "a.jsonl"
        fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
        try:
            head = os.pread(fd, 20000, 0)
            CHANGES[change](src)
            got = head
            failed = None
            try:
                while True:
                    b = os.pread(fd, 1 << 16, len(got))
                    if not b:
                        break
                    got += b
            except OSError as e:
                failed = e.errno
        finally:
            os.close(fd)
        # the open view may finish with the old version's bytes only if they were all loaded
        # before the change; every read after the change that needed the source is ESTALE
        assert failed == errno.ESTALE, f"{strategy}/{change}: read on after the change ({len(got)} bytes)"
        whole = got[: got.rfind(b"\n") + 1]  # the reads stopped inside a record
        assert not records(whole) - records(OLD), f"{strategy}/{change}: bytes not of the old version"
        stats = m.stats()
        assert stats["errors"] >= 1
        assert "a.jsonl" in m.stderr()
        m.stop()


@pytest.mark.parametrize("change", CHANGES)
def test_an_idle_view_reopened_after_a_change_shows_one_version(mount, stress, change):
    """Holds: SEMANTICS.md#changes-version, SEMANTICS.md#changes-new-open, SEMANTICS.md#errors-enoent"""
    for strategy in strategies(stress):
        m = mount({"a.jsonl": OLD}, "--strategy", strategy, *ARGS, name=f"idle-{strategy}")
        src = m.src / "a.jsonl"
        assert records(read_all(m.path("a.jsonl"))) == records(OLD)  # now idle, windows cached
        new = CHANGES[change](src)
        got = read_all(m.path("a.jsonl"))
        if new is None:
            assert got == errno.ENOENT
        else:
            assert isinstance(got, bytes), f"{strategy}/{change}: errno {got}"
            assert records(got) == records(new), f"{strategy}/{change}: not the new version"
        m.stop()


@pytest.mark.parametrize("change", ["same-size-same-mtime", "append", "truncate", "replace"])
def test_a_remount_with_the_same_cache_indexes_the_new_version(mount, change):
    """Holds: SEMANTICS.md#changes-remount"""
    m = mount({"a.jsonl": OLD}, "--strategy", "corgipile", *ARGS, name="before")
    assert records(read_all(m.path("a.jsonl"))) == records(OLD)  # the index is cached now
    m.stop()
    new = CHANGES[change](m.src / "a.jsonl")
    again = mount(None, "--strategy", "corgipile", *ARGS, "--cache-dir", str(m.cache), src=m.src, name="after")
    got = read_all(again.path("a.jsonl"))
    assert isinstance(got, bytes), f"errno {got}"
    assert records(got) == records(new)


def test_a_file_cut_mid_record_is_served_as_the_view_of_the_cut_file(mount):
    """A file cut mid-record while mounted (as the churn test cuts it) and opened again is the
    view of the cut file: its whole records and the cut one last, without a newline.
    `churn_state` takes exactly that read, and refuses a read mixing the records of two
    versions, holding a damaged record or a record twice, or missing one.

    Holds: SEMANTICS.md#changes-new-open, SEMANTICS.md#views-size, SEMANTICS.md#views-torn"""
    pad = b"x" * 150
    old = b"".join(b'{"id": %06d, "v": "old", "p": "%s"}\n' % (i, pad) for i in range(30000))
    new = old.replace(b'"old"', b'"new"')
    cut = len(old) // 9
    m = mount({"a.jsonl": old}, "--strategy", "full", "--block-size", "16KiB", "--buffer", "256KiB", name="cutone")
    whole = read_all(m.path("a.jsonl"))
    assert isinstance(whole, bytes) and churn_state(whole, old, new, cut) == "whole"
    os.truncate(m.src / "a.jsonl", cut)
    got = read_all(m.path("a.jsonl"))
    assert isinstance(got, bytes), f"errno {got}"
    assert records(got) == records(old[:cut]) and churn_state(got, old, new, cut) == "cut"
    lines = got.splitlines(keepends=True)
    size = old.index(b"\n") + 1
    assert [line for line in lines if not line.endswith(b"}\n")] == [old[cut - cut % size: cut]] == lines[-1:]

    i = next(i for i, line in enumerate(lines) if line.startswith(b'{"id": 000100,'))
    wrong = {
        "two versions": lines[:i] + [lines[i].replace(b'"old"', b'"new"')] + lines[i + 1:],
        "a damaged record": lines[:i] + [lines[i][:40] + b"\n"] + lines[i + 1:],
        "a record twice": lines[:-1] + [lines[i]] + lines[-1:],
        "missing": lines[:i] + lines[i + 1:],
    }
    for why, damaged in wrong.items():
        with pytest.raises(AssertionError, match=why):
            churn_state(b"".join(damaged), old, new, cut)


def test_a_file_cut_and_rewritten_under_record_level_copies_never_ends_the_daemon(mount):
    """``full`` windows are copied from a mapping of the source: a file cut short while a window
    copies from it faults (SIGBUS) in the daemon.  Readers read epoch after epoch while another
    thread cuts the file (mid-record) and writes it back, again and again: every read is the
    whole view of one state the file was in (`churn_state`: whole, cut short with its cut record
    last, or part written) or an errno, the daemon lives on, and
    once the churn stops the view serves the file exactly.

    Holds: SEMANTICS.md#changes-version, SEMANTICS.md#changes-open-estale"""
    import threading
    import time

    pad = b"x" * 150
    old = b"".join(b'{"id": %06d, "v": "old", "p": "%s"}\n' % (i, pad) for i in range(30000))
    new = old.replace(b'"old"', b'"new"')
    cut = len(old) // 9
    assert cut % (old.index(b"\n") + 1) != 0  # mid-record: the cut state's last record is cut
    m = mount({"a.jsonl": old}, "--strategy", "full", "--block-size", "16KiB", "--buffer", "256KiB", name="cut")
    src = m.src / "a.jsonl"
    stop = threading.Event()
    cuts = 0

    def churn() -> None:
        nonlocal cuts
        version = old
        while not stop.is_set():
            os.truncate(src, cut)
            time.sleep(0.002)
            version = new if version is old else old
            with open(src, "r+b") as f:
                f.write(version)
            cuts += 1
            time.sleep(0.01)

    t = threading.Thread(target=churn)
    t.start()
    outcomes: collections.Counter = collections.Counter()
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            got = read_all(m.path("a.jsonl"))
            if isinstance(got, int):
                outcomes[errno.errorcode.get(got, got)] += 1
                continue
            outcomes[churn_state(got, old, new, cut)] += 1
    finally:
        stop.set()
        t.join()
    assert cuts > 20
    assert m.stats()["errors"] >= 1  # the daemon answers, and saw the changes
    final = src.read_bytes()
    got = read_all(m.path("a.jsonl"))
    assert isinstance(got, bytes) and records(got) == records(final), outcomes
