"""Level: mounted (real FUSE mounts, real readers).

``--source-cache``: a mount that drops its windows' source pages once each window is built serves
exactly the bytes of one that keeps them (and of the automatic choice), says what it chose in
``shufflefs stat``, and still never serves bytes of a source that changed under it.
"""

from __future__ import annotations

import errno
import os

import pytest

from test_changes import CHANGES, OLD, records

ARGS = ["--block-size", "16KiB", "--buffer", "64KiB"]
DATA = b"".join(b'{"id": %06d, "label": %d, "pad": "%s"}\n' % (i, i // 500, b"x" * (i % 97)) for i in range(6000))
PART = DATA[: DATA.index(b"\n", len(DATA) // 3) + 1]


def uncache(*paths) -> None:
    """The files' pages out of the page cache, as for a file larger than memory."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("strategy", ["none", "stratified", "full"])
def test_dropping_or_bypassing_source_pages_serves_the_same_bytes_as_keeping_them(mount, strategy):
    """Holds: SEMANTICS.md#views-source-cache"""
    got, stats = {}, {}
    for mode in ("keep", "drop", "direct", "auto"):
        # blocks of 64 KiB: windows of long runs are read by preads (short ones of a cached file
        # are copied from its mapping, which drops nothing: `view.MAP_RUN`)
        args = ["--strategy", strategy, "--block-size", "64KiB", "--buffer", "256KiB",
                *(["--source-cache", mode] if mode != "auto" else [])]
        m = mount({"a.jsonl": DATA, "d/b.jsonl": PART}, *args, name=f"{strategy}-{mode}")
        first = (m.path("a.jsonl").read_bytes(), m.path("d/b.jsonl").read_bytes())  # indexes built
        os.setxattr(m.path(), "user.shufflefs.epoch", b"1")  # new views, their windows not loaded yet
        uncache(m.src / "a.jsonl", m.src / "d/b.jsonl")  # as a file larger than memory is
        got[mode] = first + (m.path("a.jsonl").read_bytes(), m.path("d/b.jsonl").read_bytes())
        stats[mode] = m.stats()["source_cache"]
        m.stop()
    assert got["drop"] == got["keep"] == got["auto"] == got["direct"]
    assert records(got["drop"][0]) == records(DATA)
    assert stats["drop"]["views"] == {"drop: --source-cache": 4}  # two files, two epochs
    assert stats["keep"]["views"] == {"keep: --source-cache": 4} and stats["keep"]["dropped_bytes"] == 0
    assert stats["auto"]["option"] == "auto" and stats["auto"]["room"] > 0
    assert stats["auto"]["views"] == {"keep: source and view fit the page cache": 4}  # small files
    assert stats["direct"]["views"] == {"direct: --source-cache": 4}
    loads = stats["direct"]["window_loads"]  # record-level windows have no runs to read so
    assert loads.get("direct", 0) == 0 if strategy == "full" else loads.get("direct", 0) >= 2, loads
    assert "direct" not in stats["keep"]["window_loads"] and "direct" not in stats["drop"]["window_loads"]
    # block orders drop their windows' runs (record bytes); record-level ones have no runs
    dropped = stats["drop"]["dropped_bytes"]
    if strategy == "full":
        assert dropped == 0
    else:
        assert len(DATA) // 2 < dropped <= 2 * (len(DATA) + len(PART))


@pytest.mark.parametrize("change", ["same-size-same-mtime", "truncate", "replace"])
@pytest.mark.parametrize("mode", ["drop", "direct"])
@pytest.mark.parametrize("strategy", ["none", "stratified"])
def test_a_source_changed_under_a_dropping_or_direct_view_is_estale_never_other_bytes(mount, change, mode, strategy):
    """Holds: SEMANTICS.md#views-source-cache, SEMANTICS.md#changes-version"""
    m = mount({"a.jsonl": OLD}, "--strategy", strategy, *ARGS, "--source-cache", mode, name=f"{strategy}-{change}")
    src = m.src / "a.jsonl"
    uncache(src)
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    failed = None
    try:
        got = os.pread(fd, 20000, 0)
        CHANGES[change](src)
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
    assert failed == errno.ESTALE, f"{strategy}/{change}: read on after the change ({len(got)} bytes)"
    whole = got[: got.rfind(b"\n") + 1]
    assert not records(whole) - records(OLD), f"{strategy}/{change}: bytes not of the old version"
    assert m.stats()["source_cache"]["views"] == {f"{mode}: --source-cache": 1}
    m.stop()
