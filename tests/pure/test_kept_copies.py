"""Level: pure (no FUSE).

Kept decoded copies (`stages.kept_copies`): the least recently kept go first when a copy needs
room, a copy is taken whole by one taker, and another version of its source is never taken."""

from __future__ import annotations

import os
import time
from pathlib import Path

from shufflefs.index.table import SourceStamp
from shufflefs.stages.kept_copies import KeptCopies


def test_kept_copies_make_room_oldest_first_and_match_only_their_version(tmp_path: Path):
    free = [10 << 30]

    def room() -> tuple[int, int]:  # what unlinking kept copies frees
        return free[0] - keeps.describe()["bytes"], 1 << 30

    keeps = KeptCopies(str(tmp_path / "root"), room)
    for i in range(3):
        f = tmp_path / f"copy-{i}"
        f.write_bytes(b"x" * (1000 * (i + 1)))
        assert keeps.keep(f"/src/{i}.jsonl.gz", SourceStamp(10 + i, 1, 1 + i, 1), str(f))
        assert not f.exists()
    assert len(os.listdir(keeps.dir)) == 3
    assert keeps.trim(1 << 20) == 0  # room enough
    free[0] = (1 << 30) + 6000 + 500
    assert keeps.trim(1000) == 1000  # the oldest kept goes first, then there is room
    assert keeps.describe() == {"files": 2, "bytes": 5000}
    out = str(tmp_path / "taken")
    assert keeps.take("/src/2.jsonl.gz", SourceStamp(12, 1, 3, 1), 3000, out) == out
    assert Path(out).read_bytes() == b"x" * 3000
    assert keeps.take("/src/2.jsonl.gz", SourceStamp(12, 1, 3, 1), 3000, out + "2") is None  # taken once
    assert keeps.take("/src/1.jsonl.gz", SourceStamp(11, 1, 2, 2), 2000, out + "b") is None  # another version
    assert keeps.describe() == {"files": 0, "bytes": 0}  # and that one's stale copy is gone


def test_an_unknown_free_space_removes_nothing_and_a_resized_copy_is_not_taken(tmp_path: Path):
    keeps = KeptCopies(str(tmp_path), lambda: None)
    f = tmp_path / "copy"
    f.write_bytes(b"y" * 100)
    assert keeps.keep("/src/a.gz", SourceStamp(5, 1, 1, 1), str(f))
    assert keeps.trim(1 << 40) == 0
    (kept,) = Path(keeps.dir).iterdir()
    with open(kept, "ab") as g:
        g.write(b"z")
    assert KeptCopies(str(tmp_path), lambda: None).take("/src/a.gz", SourceStamp(5, 1, 1, 1), 100,
                                                        str(tmp_path / "t")) is None
    assert not (tmp_path / "t").exists() and list(Path(keeps.dir).iterdir()) == []


def test_a_copy_kept_in_one_layout_is_never_taken_for_another(tmp_path: Path):
    keeps = KeptCopies(str(tmp_path), lambda: None)
    f = tmp_path / "copy"
    f.write_bytes(b"r" * 64)
    stamp = SourceStamp(64, 1, 1, 1)
    assert keeps.keep("parquet\0/src/a.parquet", stamp, str(f), layout="1\0digest")
    out = str(tmp_path / "t")
    assert keeps.take("parquet\0/src/a.parquet", stamp, 64, out, layout="2\0digest") is None  # another layout
    assert not os.path.exists(out) and list(Path(keeps.dir).iterdir()) == []  # and that copy is gone
    f.write_bytes(b"r" * 64)
    assert keeps.keep("parquet\0/src/a.parquet", stamp, str(f), layout="1\0digest")
    assert KeptCopies(str(tmp_path), lambda: None).take("parquet\0/src/a.parquet", stamp, 64, out,
                                                        layout="1\0digest") == out


def test_spare_files_are_named_at_most_three_taken_once_and_only_plain_files(tmp_path: Path):
    from shufflefs.stages.kept_copies import SPARES

    keeps = KeptCopies(str(tmp_path / "root"), lambda: None)
    fds = [os.open(tmp_path, os.O_TMPFILE | os.O_RDWR, 0o600) for _ in range(SPARES + 1)]
    for fd in fds:
        os.write(fd, b"old bytes")
    assert [keeps.keep_spare(fd) for fd in fds] == [True] * SPARES + [False]  # at most three
    for fd in fds:
        os.close(fd)
    assert keeps.describe() == {"files": 0, "bytes": 0}  # spares are no kept copies
    named = tmp_path / "named"
    named.write_bytes(b"x")
    fd = os.open(named, os.O_RDWR)
    os.unlink(list(Path(keeps.dir).iterdir())[0])
    assert keeps.keep_spare(fd, str(named)) and not named.exists()  # a named one moves
    os.close(fd)
    (Path(keeps.dir) / "spare-1.1.1").symlink_to(tmp_path / "named")  # not the daemon's kind of file
    os.mkfifo(Path(keeps.dir) / "spare-2.1.1")
    first = keeps.take_spare(str(tmp_path / "first"))  # the newest spare; the symlink and FIFO go at once
    assert first is not None and sorted(p.name for p in Path(keeps.dir).iterdir() if p.name.endswith(".1.1")) == []
    taken = [first]
    while (fd := keeps.take_spare(str(tmp_path / f"t{len(taken)}"))) is not None:
        assert os.fstat(fd).st_nlink == 1 and os.path.isfile(tmp_path / f"t{len(taken)}")
        taken.append(fd)
    assert len(taken) == SPARES and list(Path(keeps.dir).iterdir()) == []  # the others removed, not opened
    assert sorted(os.pread(fd, 9, 0) for fd in taken) == sorted([b"old bytes"] * (SPARES - 1) + [b"x"])
    for fd in taken:
        os.close(fd)


def test_a_spare_large_enough_for_the_stage_is_taken_before_a_newer_smaller_one(tmp_path: Path):
    """A stage grown past its spare's old end allocates every new page: a mount of one large
    file after a mount of shards took a shard's spare for its whole-file stage.  A larger file
    takes the place of the smallest spare once three are kept."""
    from shufflefs.stages.kept_copies import SPARES

    keeps = KeptCopies(str(tmp_path / "root"), lambda: None)

    def keep(size: int) -> bool:
        fd = os.open(tmp_path, os.O_TMPFILE | os.O_RDWR, 0o600)
        os.write(fd, b"s" * size)
        try:
            return keeps.keep_spare(fd)
        finally:
            os.close(fd)
            time.sleep(0.01)  # kept in order

    assert SPARES == 3 and [keep(size) for size in (1000, 5000, 3000)] == [True] * 3
    assert keep(2000) and not keep(500)  # the 1000-byte one makes room for the larger; not for the smaller
    assert sorted(p.stat().st_size for p in Path(keeps.dir).iterdir()) == [2000, 3000, 5000]

    def taken(size: int) -> int:
        fd = keeps.take_spare(str(tmp_path / f"t{size}"), size)
        assert fd is not None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    assert taken(4000) == 5000  # the only one large enough
    assert taken(0) == 2000  # the newest of those large enough
    assert taken(8000) == 3000  # none is: the largest left


def test_stage_files_are_taken_large_enough_first(tmp_path: Path):
    from shufflefs.stages.parquet_stage import StageFiles

    files = StageFiles(str(tmp_path))
    got = [files.take() for _ in range(3)]
    for f, size in zip(got, (100, 900, 500)):
        f.resize(size)
    for f in got:
        files.give_back(f)
    assert files.take(600).size == 900
    assert files.take(0).size == 500  # the one given back last of those large enough
    assert files.take(10_000).size == 100
    files.close()
    files = StageFiles(str(tmp_path))  # the views of two epochs of a file differ by a few bytes
    older, newer = files.take(), files.take()
    older.resize(1000)
    newer.resize(990)
    files.give_back(older)
    files.give_back(newer)
    assert files.take(1000) is newer  # given back last: its pages the likeliest cached
    files.close()


def test_a_stage_file_given_back_while_the_mount_closes_is_left_for_the_next_mount(tmp_path: Path):
    """A build the unmount stopped gives its file back at its next window: `StageFiles.close`
    waits for it (a later mount that read one epoch left one spare, the next epoch's file, still
    being written, was closed), and a file given back after the wait is closed, not kept."""
    import threading

    from shufflefs.stages.parquet_stage import StageFiles

    keeps = KeptCopies(str(tmp_path / "root"), lambda: None)
    files = StageFiles(str(tmp_path), keeps)
    held, building, late = files.take(4096), files.take(4096), files.take(4096)
    for f in (held, building, late):
        f.resize(4096)
    files.give_back(held)  # its view closed
    threading.Timer(0.3, files.give_back, (building,)).start()  # stopped at its next window
    files.CLOSE_WAIT = 1.0
    t0 = time.monotonic()
    files.close()
    assert 0.9 < time.monotonic() - t0 < 2.0  # `late` never came back within the wait: it ends
    assert len([p for p in Path(keeps.dir).iterdir() if p.name.startswith("spare-")]) == 2
    files.give_back(late)  # after the wait: closed, never kept or reused
    assert late.fd < 0
    assert len(list(Path(keeps.dir).iterdir())) == 2

