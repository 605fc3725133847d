"""Level: mounted (real FUSE mounts, real readers).

Parquet copies kept across mounts: at unmount a mount's whole decoded copies of Parquet files stay
on the node-local disk (``kept-copies`` under the stage or cache directory, beside compressed
files' copies), and a later mount of the same files takes them, so its first epoch is encoded from
a copy instead of decoding every row group again.  A source changed in between, a kept copy
changed on disk, or a copy only part filled is never read: the view is made as without one, and
holds the same bytes either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from conftest import REPO, wait_for  # noqa: E402

ARGS = ("--seed", "3", "--buffer", "2MiB")
NAMES = pf.TWO_FILES


def kept(cache: Path, spares: bool = False) -> list[Path]:
    """The copies kept under ``cache`` (or, ``spares``, the stage files left for the next mount)."""
    got = sorted((cache / "kept-copies").glob("*")) if (cache / "kept-copies").is_dir() else []
    return [p for p in got if p.name.startswith("spare-") == spares]


def made(m) -> dict[str, dict]:
    return {Path(p).name: c for p, c in m.stats().get("parquet_copies", {}).get("copies", {}).items()}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return pf.two_files(tmp_path / "pqsrc")


def first_mount(mount, src: Path, *args: str):
    """A mount that reads every view whole once (its copies filled), then unmounted."""
    m = mount(None, *ARGS, *args, src=src)
    got = {name: m.path(name).read_bytes() for name in NAMES}
    m.stop()
    assert m.returncode == 0, m.stderr()
    return m, got


def test_a_later_mount_encodes_its_views_from_the_copies_the_first_one_kept(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-copy, SEMANTICS.md#views-order"""
    first, epoch0 = first_mount(mount, src)
    assert len(kept(first.cache)) == len(NAMES)
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), src=src, name="later")
    fresh = mount(None, *ARGS, src=src, name="fresh")  # nothing cached, nothing kept
    for name in NAMES:
        assert later.path(name).read_bytes() == epoch0[name] == fresh.path(name).read_bytes()
        assert pq.read_table(later.path(name)).num_rows == pq.read_table(src / name).num_rows
        for m in (later, fresh):
            m.set_epoch(1, name)
        assert later.path(name).read_bytes() == fresh.path(name).read_bytes() != epoch0[name]
    copies = made(later)
    assert {n: (c["made"], c["copied"] == c["row_groups"], c["seconds"]) for n, c in copies.items()} == {
        n: ("by an earlier mount", True, 0.0) for n in NAMES}, copies  # no row group decoded again
    assert made(fresh)[NAMES[1]]["made"] == "by this mount"
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(later.path())], capture_output=True,
                         text=True, timeout=60).stdout
    assert "row groups decoded" in out and "by an earlier mount" in out, out
    assert kept(first.cache) == []  # taken, not shared
    later.stop()
    assert later.returncode == 0 and len(kept(first.cache)) == len(NAMES)  # kept again for the next


def test_a_changed_source_or_kept_copy_or_a_part_filled_copy_is_not_read(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-copy, SEMANTICS.md#changes-new-open"""
    first, _ = first_mount(mount, src)
    copies = {p.stat().st_size: p for p in kept(first.cache)}
    assert len(copies) == 2
    pf.label_sorted(src / NAMES[1], n=12_000, group_rows=3_000, seed=9)  # a new version of one file
    fresh = mount(None, *ARGS, src=src, name="fresh")
    fresh.path(NAMES[0]).read_bytes()
    damaged = copies[made(fresh)[NAMES[0]]["bytes"]]  # the copy of the file that did not change
    with open(damaged, "r+b") as f:  # damaged on disk, its size kept
        f.seek(200)
        f.write(b"\xff" * 32)
    os.utime(damaged, ns=(damaged.stat().st_atime_ns, damaged.stat().st_mtime_ns + 1))
    # another epoch than the first mount's: its stages, kept whole, would need no copy at all
    later = mount(None, *ARGS, "--epoch", "2", "--cache-dir", str(first.cache), src=src, name="later")
    fresh.set_epoch(2)
    for name in NAMES:
        assert later.path(name).read_bytes() == fresh.path(name).read_bytes()
    assert {c["made"] for c in made(later).values()} == {"by this mount"}, made(later)
    assert "changed since it was kept" in later.stderr()
    assert pq.read_table(later.path(NAMES[1])).num_rows == 12_000
    later.stop()
    assert later.returncode == 0
    after = kept(first.cache)
    assert len(after) == 2 and not set(after) & {damaged}, after  # made again, and kept
    # a copy only part filled (the first row group read in file order, no stage) is not kept
    pf.label_sorted(src / "big.parquet", n=60_000, group_rows=2_000)
    part = mount(None, *ARGS, "--strategy", "none", "--passthrough", "off", src=src, name="part")
    f = pq.ParquetFile(part.path("big.parquet"))
    assert f.read_row_group(0).num_rows > 0
    del f
    part.path(NAMES[0]).read_bytes()  # and one read whole
    big = made(part)["big.parquet"]
    assert 0 < big["copied"] < big["row_groups"], big
    part.stop()
    assert part.returncode == 0 and [p.stat().st_size for p in kept(part.cache)] == [made(fresh)[NAMES[0]]["bytes"]]


def test_a_pool_of_shards_takes_its_kept_copy_until_a_member_changes(mount, tmp_path: Path):
    """Holds: SEMANTICS.md#views-parquet-copy, SEMANTICS.md#ranks-pools"""
    shards = [f"train-{i:05d}-of-00003.parquet" for i in range(3)]
    d = tmp_path / "pool"
    d.mkdir()
    whole = pq.read_table(pf.label_sorted(tmp_path / "whole.parquet", n=15_000, group_rows=2_500))
    for i, name in enumerate(shards):
        pq.write_table(whole.slice(i * 5_000, 5_000), d / name, row_group_size=2_500)
    first = mount(None, *ARGS, src=d)
    epoch0 = {name: first.path(name).read_bytes() for name in shards}
    first.stop()
    assert first.returncode == 0 and len(kept(first.cache)) == 1  # the pool's one copy
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), src=d, name="later")
    assert {name: later.path(name).read_bytes() for name in shards} == epoch0
    assert [c["made"] for c in made(later).values()] == ["by an earlier mount"]
    later.stop()
    assert later.returncode == 0 and len(kept(first.cache)) == 1
    pq.write_table(whole.slice(5_000, 4_000), d / shards[1], row_group_size=2_500)  # one member rewritten
    again = mount(None, *ARGS, "--cache-dir", str(first.cache), src=d, name="again")
    fresh = mount(None, *ARGS, src=d, name="fresh")
    got = {name: again.path(name).read_bytes() for name in shards}
    assert got == {name: fresh.path(name).read_bytes() for name in shards}
    assert sum(pq.read_table(again.path(name)).num_rows for name in shards) == 14_000
    assert [c["made"] for c in made(again).values()] == ["by this mount"]


@pytest.mark.parametrize("passthrough", ["auto", "off"])
def test_a_mount_stopped_while_readers_hold_its_views_keeps_its_copies(mount, src: Path, passthrough: str):
    """Unmounted by SIGTERM (a busy mount: ``fusermount3 -u`` fails) with every view still open in
    a reader: the shutdown releases the handles and keeps the copies as a plain unmount does.
    Holds: SEMANTICS.md#views-parquet-copy, SEMANTICS.md#umount-signals"""
    first = mount(None, "-v", *ARGS, "--passthrough", passthrough, src=src)
    held = [pq.ParquetFile(first.path(name)) for name in NAMES]
    rows = [sum(b.num_rows for b in f.iter_batches()) for f in held]
    assert rows == [pq.ParquetFile(src / name).metadata.num_rows for name in NAMES]
    first.stop()
    log = first.stderr()
    assert first.returncode == 0 and "Traceback" not in log and f"unmounted {first.mnt}" in log, log
    assert len(kept(first.cache)) == len(NAMES)
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), src=src, name="later")
    for name in NAMES:
        assert pq.read_table(later.path(name)).num_rows == pq.read_table(src / name).num_rows
    assert {c["made"] for c in made(later).values()} == {"by an earlier mount"}
    del held


def test_a_truncated_kept_copy_is_removed_and_a_killed_mount_loses_only_the_copy_it_took(mount, src: Path):
    """Holds: SEMANTICS.md#views-parquet-copy"""
    first, epoch0 = first_mount(mount, src)
    copies = kept(first.cache)
    assert len(copies) == 2
    with open(copies[0], "r+b") as f:  # a copy cut short on disk
        f.truncate(copies[0].stat().st_size // 2)
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), src=src, name="later")
    assert {name: later.path(name).read_bytes() for name in NAMES} == epoch0
    assert sorted(c["made"] for c in made(later).values()) == ["by an earlier mount", "by this mount"]
    assert "changed since it was kept" in later.stderr() and kept(first.cache) == []
    os.kill(later.pid, signal.SIGKILL)  # its copies (the one it took among them) are lost with it
    later.wait()
    subprocess.run([sys.executable, "-m", "shufflefs", "umount", str(later.mnt)], capture_output=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    again = mount(None, *ARGS, "--cache-dir", str(first.cache), src=src, name="again")
    assert {name: again.path(name).read_bytes() for name in NAMES} == epoch0
    assert {c["made"] for c in made(again).values()} == {"by this mount"}
    left = [p.name for p in first.cache.iterdir() if p.name.startswith("parquet-")]
    assert len(left) == 1, left  # the killed mount's directory removed; this mount's own


def test_stage_files_are_left_for_the_next_mount_and_hold_its_own_bytes(mount, src: Path, tmp_path: Path):
    """Stage files (FUSE passthrough) are written into the files an earlier mount left, whose blocks
    and cached pages are reused; their old bytes never show.  A spare that is not a plain file of
    the daemon's is not opened.  Holds: SEMANTICS.md#views-parquet-passthrough"""
    first, epoch0 = first_mount(mount, src)
    if not kept(first.cache, spares=True):
        pytest.skip("no FUSE passthrough here: no stage files")
    fifo = first.cache / "kept-copies" / "spare-1.1.1"  # a name like the spares', not one of its files
    os.mkfifo(fifo)
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), src=src, name="later")
    served = mount(None, *ARGS, "--passthrough", "off", src=src, name="served")
    pf.read_as_served(later, served, (4, 5), epoch0)  # epochs no stage was kept of: written into spares
    assert later.stats()["passthrough"]["stage_files_reused"] >= 1, later.stats()["passthrough"]
    assert not fifo.exists()  # not opened (it would block), removed
    later.stop()
    assert later.returncode == 0
    assert 1 <= len(kept(first.cache, spares=True)) <= 3


def test_a_mount_that_read_one_epoch_leaves_the_next_epochs_stage_file_too(mount, tmp_path: Path):
    """A job that reads one epoch and ends: the next epoch's stage, built while that epoch was
    read, is stopped by the unmount; its file is left spare beside the first one's (the unmount
    waits for it), so the first epoch of the next mount writes both its stages into old files.
    Holds: SEMANTICS.md#views-parquet-passthrough"""
    d = tmp_path / "one"
    d.mkdir()
    pf.label_sorted(d / "big.parquet", n=240_000, group_rows=20_000)  # ~140 MB: a build of a few windows
    for round_ in range(2):  # the second at epochs the first did not stage: no stage kept whole for it
        m = mount(None, *ARGS, "-v", "--epoch", str(3 * round_), "--cache-dir", str(tmp_path / "cache"), src=d,
                  name=f"m{round_}")
        assert pq.ParquetFile(m.path("big.parquet")).metadata.num_rows == 240_000
        rows = sum(b.num_rows for b in pq.ParquetFile(m.path("big.parquet")).iter_batches())
        if m.stats()["passthrough"]["on"]:  # a slow machine's reader may end before the build ahead took its file
            wait_for(lambda: m.stats()["passthrough"]["stage_files"] >= 2, "the build ahead to take its file")
        state = m.stats()["passthrough"]
        m.stop()
        assert m.returncode == 0 and rows == 240_000, m.stderr()
        if not state["on"]:
            pytest.skip("no FUSE passthrough here: no stage files")
        assert len(kept(tmp_path / "cache", spares=True)) == 2, (state, m.stderr())
    assert state["stage_files_reused"] == 2, state  # the second mount's first two stages


def test_a_kept_copy_read_from_disk_gives_the_stages_the_same_bytes(mount, src: Path):
    """A later mount whose kept copies are on disk only (dropped from the page cache, as after a
    reboot) reads the largest column of a copy around the page cache into its first stages
    (`stages.parquet_scatter`); every epoch holds the bytes a mount serving from its own copy
    does.  Holds: SEMANTICS.md#views-parquet-copy, SEMANTICS.md#views-parquet-passthrough"""
    first, epoch0 = first_mount(mount, src)
    if not kept(first.cache, spares=True):
        pytest.skip("no FUSE passthrough here: no stages")
    for path in kept(first.cache):
        pf.drop_from_page_cache(path)
    later = mount(None, *ARGS, "--cache-dir", str(first.cache), src=src, name="later")
    served = mount(None, *ARGS, "--passthrough", "off", src=src, name="served")
    for epoch in (0, 1, 2):
        pf.read_as_served(later, served, (epoch,), epoch0)
        for name in NAMES:
            assert pq.read_table(later.path(name)).num_rows == pq.read_table(src / name).num_rows
    state = later.stats()["passthrough"]
    assert {c["made"] for c in made(later).values()} == {"by an earlier mount"}
    assert state["stages_scattered"] >= 1, state  # the label-sorted file's text, at least
    assert state["opens"] >= 1, state  # passed through: such a stage is opened whole, not read as written
    later.stop()
    assert later.returncode == 0 and len(kept(first.cache)) == len(NAMES)


def test_nothing_is_kept_on_a_filesystem_in_memory(mount, src: Path, tmp_path: Path):
    """A cache directory in memory (tmpfs) would hold what a mount keeps until the next one: the
    copies and stage files go at unmount.  Holds: SEMANTICS.md#views-parquet-copy"""
    from shufflefs.stages.kept_copies import in_memory

    stage = tmp_path / "in-memory"
    stage.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(stage)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert in_memory(str(stage / "kept-copies"))
        m = mount(None, *ARGS, "-v", "--cache-dir", str(stage), src=src)
        for name in NAMES:
            m.path(name).read_bytes()
        assert all(c["copied"] == c["row_groups"] for c in made(m).values())
        m.stop()
        assert m.returncode == 0
        assert kept(stage) == [] and kept(stage, spares=True) == [] and "is in memory" in m.stderr()
        assert [p for p in stage.rglob("*") if p.is_file() and p.suffix != ".npz"] == []  # indexes only
    finally:
        subprocess.run(["umount", str(stage)], capture_output=True)
