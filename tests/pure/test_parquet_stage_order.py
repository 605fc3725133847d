"""Level: pure (no mount, no daemon).

A Parquet view encoded whole into its stage reads each plan window's rows from the order its
layout worked out (`ParquetLayout.order`) instead of shuffling the window again: the stage holds
the bytes a view without that order loads, and the order is let go once the stage is written, or
as soon as the view is loaded for a reader.  Each open of a stage asks the kernel for its pages
ahead of the reader, its footer first (`ParquetStage.read_ahead`)."""

from __future__ import annotations

import contextlib
import io
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from shufflefs import scratch  # noqa: E402
from shufflefs.formats import make_format, scan_file  # noqa: E402
from shufflefs.sources.local import SourceFile  # noqa: E402
from shufflefs.stages.parquet_rows import RowCopies  # noqa: E402
from shufflefs.stages.parquet_stage import StageFiles, write_stage  # noqa: E402
from shufflefs.strategies import make_plan  # noqa: E402
from shufflefs.strategies.base import ShuffleSpec  # noqa: E402
from shufflefs.stages.parquet_view import ParquetLayout, ParquetView  # noqa: E402


@pytest.mark.parametrize("strategy", ["stratified", "corgipile", "full"])
def test_a_stage_from_the_layouts_order_is_the_view(tmp_path: Path, strategy: str) -> None:
    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=3_000)
    index = scan_file(src, make_format("parquet"))
    copies = RowCopies(tmp_path / "copies")
    files = StageFiles(str(tmp_path))

    def view(epoch: int) -> ParquetView:
        plan = make_plan(index, ShuffleSpec(strategy=strategy, buffer=1 << 20), epoch, 0, 1)
        copy = copies.acquire(str(src), index)
        return ParquetView(str(src), index, plan, ParquetLayout(index, plan), SourceFile(str(src), index.stamp),
                           copy, lambda: copies.release(copy))

    staged, loaded = view(4), view(4)
    try:
        assert staged._order is not None and staged.layout.order is None  # taken from its layout
        lay = loaded.layout
        first, _ = loaded.load_window(0)  # loaded for a reader: the order goes
        assert loaded._order is None
        want = b"".join([bytes(loaded.header), bytes(first)]
                        + [bytes(loaded.load_window(k)[0]) for k in range(1, lay.n_windows)] + [bytes(loaded.trailer)])
        stage = write_stage(staged, files)
        assert staged._order is None and staged.writer is None
        assert bytes(stage.data) == want and len(want) == lay.size
        assert pq.ParquetFile(tmp_path / "s.parquet").metadata.num_rows == sum(
            b.num_rows for b in pq.ParquetFile(io.BytesIO(want)).iter_batches())
        stage.close()
        other = view(5)
        other.drop_order()  # a view whose order was let go encodes the same bytes from its plan
        again = write_stage(other, files)
        fresh = view(5)
        ordered = write_stage(fresh, files)
        assert bytes(again.data) == bytes(ordered.data) and np.asarray(again.data).size == other.layout.size
        for done in (again, ordered, other, fresh):
            done.close()
    finally:
        staged.close()
        loaded.close()
        files.close()
        copies.close()


def test_as_many_stage_files_wait_for_reuse_as_were_in_use_at_once(tmp_path: Path) -> None:
    """Shards read in turn hold more stages at once than `StageFiles.KEPT` (an epoch's views and
    the next one's stage built ahead): every file given back waits for the next epoch's stages,
    none is closed and made again (a new file's pages cost several times the writes)."""
    files = StageFiles(str(tmp_path))
    for _ in range(3):  # epochs: five stages in use at once, then all given back
        taken = [files.take() for _ in range(5)]
        for f in taken:
            files.give_back(f)
    assert files.made == 5 and files.closed == 0
    small = StageFiles(str(tmp_path))  # a file read alone: at most KEPT wait
    taken = [small.take() for _ in range(2)]
    for f in taken:
        small.give_back(f)
    assert small.made == 2 and small.closed == 0 and len(small._free) == 2
    files.close()
    small.close()


def test_stage_builds_encode_in_the_buffer_the_build_before_used(tmp_path: Path) -> None:
    """A new buffer for every build was mapped and zeroed afresh (arrays from 1 MiB on are their
    own mappings): four shards' builds an epoch faulted in a window's worth of pages each.  The
    next build takes the buffer back, and its stage is still the view's bytes."""
    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=3_000)
    index = scan_file(src, make_format("parquet"))
    copies = RowCopies(tmp_path / "copies")
    files = StageFiles(str(tmp_path))
    views: list[ParquetView] = []

    def view(epoch: int) -> ParquetView:
        plan = make_plan(index, ShuffleSpec(strategy="stratified", buffer=1 << 20), epoch, 0, 1)
        copy = copies.acquire(str(src), index)
        views.append(ParquetView(str(src), index, plan, ParquetLayout(index, plan), SourceFile(str(src), index.stamp),
                                 copy, lambda: copies.release(copy)))
        return views[-1]

    try:
        first = write_stage(view(1), files, threads=1)
        assert len(files._buffers) == 1
        kept = files._buffers[0]
        second = write_stage(view(2), files, threads=1)
        assert len(files._buffers) == 1 and files._buffers[0] is kept  # borrowed, written in, lent back
        loaded = view(2)
        lay = loaded.layout
        want = b"".join([bytes(loaded.header)] + [bytes(loaded.load_window(k)[0]) for k in range(lay.n_windows)]
                        + [bytes(loaded.trailer)])
        assert bytes(second.data) == want and bytes(first.data) != want
        for extra in range(3):
            files.lend_back(np.empty(1 << 20, np.uint8))
        assert len(files._buffers) == StageFiles.BUFFERS  # one a thread of a build, no more
        first.close()
        second.close()
    finally:
        for v in views:
            v.close()
        files.close()
        copies.close()


def test_a_copy_being_filled_stops_when_the_mount_stops_and_is_not_kept(tmp_path: Path) -> None:
    """A stop (SIGTERM) ends a copy's fill at its next batch, not after the whole file is decoded
    (a 1 GiB file took 4.5 s, near the grace after which the daemon is detached, not unmounted);
    the part filled copy is neither served nor kept, and the next fill starts it again.
    Holds: SEMANTICS.md#umount-signals"""
    from shufflefs.errors import StageError

    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=2_000)
    index = scan_file(src, make_format("parquet"))
    groups = np.arange(len(index.footer.group_rows))
    copies = RowCopies(tmp_path / "copies")
    copy = copies.acquire(str(src), index)
    try:
        copy.ensure(groups[:3], SourceFile(str(src), index.stamp))
        copies.stop.set()
        with pytest.raises(StageError, match="stopping"):
            copy.ensure(groups, SourceFile(str(src), index.stamp))
        assert copy.filled == 3 and not copy.complete
    finally:
        copies.release(copy)
        copies.close()
    assert not (tmp_path / "copies" / "kept-copies").exists() or not any((tmp_path / "copies" / "kept-copies").iterdir())
    again = RowCopies(tmp_path / "copies")  # the next mount: nothing kept, filled whole
    copy = again.acquire(str(src), index)
    try:
        assert copy.made == "by this mount" and copy.filled == 0
        copy.ensure(groups, SourceFile(str(src), index.stamp))
        assert copy.complete
    finally:
        again.release(copy)
        again.close()


@contextlib.contextmanager
def views_of(tmp_path: Path, epoch: int = 0) -> Iterator[tuple[Callable[[], ParquetView], RowCopies, StageFiles]]:
    """(a maker of views of one label-sorted file at ``epoch``, its copies, stage files), all
    closed after."""
    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=2_000)
    index = scan_file(src, make_format("parquet"))
    copies = RowCopies(tmp_path / "copies")
    files = StageFiles(str(tmp_path))
    plan = make_plan(index, ShuffleSpec(buffer=1 << 20), epoch, 0, 1)
    made: list[ParquetView] = []

    def view() -> ParquetView:
        copy = copies.acquire(str(src), index)
        made.append(ParquetView(str(src), index, plan, ParquetLayout(index, plan), SourceFile(str(src), index.stamp),
                                copy, lambda: copies.release(copy)))
        return made[-1]

    try:
        yield view, copies, files
    finally:
        copies.stop.clear()
        for v in made:
            v.close()
        files.close()
        copies.close()


def test_a_stage_being_written_stops_when_the_mount_stops(tmp_path: Path) -> None:
    """Holds: SEMANTICS.md#umount-signals"""
    from shufflefs.errors import StageError

    with views_of(tmp_path) as (make, copies, files):
        view = make()
        copies.stop.set()
        with pytest.raises(StageError, match="stopping"):
            write_stage(view, files)
        assert view.writer is None and len(files._free) == 1  # its file went back


def test_read_ahead_asks_for_the_tail_first_then_front_to_back_and_closes_its_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (3 * scratch.READ_AHEAD + 100))
    asked: list[tuple[int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: (asked.append((off, n)), real(fd, off, n, advice)))
    fd = os.open(path, os.O_RDONLY)
    scratch.read_ahead(fd, path.stat().st_size, tail=100)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed: it was the read-ahead's own
    size = path.stat().st_size
    assert asked == [(size - 100, 100)] + [(k * scratch.READ_AHEAD, min(scratch.READ_AHEAD, size - k * scratch.READ_AHEAD))
                                           for k in range(4)]
    asked.clear()
    scratch.read_ranges_ahead_in_thread(os.open(path, os.O_RDONLY), [(10, 20), (size - 5, size)], "ahead").join()
    assert asked == [(10, 10), (size - 5, 5)]
    waited: list[int] = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: (waited.append(off), pread(fd, n, off))[1])
    scratch.read_ahead(os.open(path, os.O_RDONLY), size)
    assert waited == []
    scratch.read_ahead(os.open(path, os.O_RDONLY), size, settle=True)  # then waits for each request, in order
    assert waited == [min((k + 1) * scratch.READ_AHEAD, size) - 1 for k in range(4)]


def test_a_stage_not_all_cached_is_read_ahead_by_one_thread_at_a_time_and_not_once_closed(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=3_000)
    index = scan_file(src, make_format("parquet"))
    copies = RowCopies(tmp_path / "copies")
    files = StageFiles(str(tmp_path))
    gate, entered = threading.Event(), threading.Event()
    started: list[tuple[int, int]] = []

    def held(fd: int, size: int, tail: int = 0, settle: bool = False) -> None:
        started.append((size, tail))
        assert settle  # alive until its pages are read: a build ahead waits for that
        entered.set()
        gate.wait(10)
        os.close(fd)

    monkeypatch.setattr(scratch, "read_ahead", held)
    plan = make_plan(index, ShuffleSpec(buffer=1 << 20), 3, 0, 1)
    copy = copies.acquire(str(src), index)
    view = ParquetView(str(src), index, plan, ParquetLayout(index, plan), SourceFile(str(src), index.stamp),
                       copy, lambda: copies.release(copy))
    try:
        stage = write_stage(view, files)
        stage.read_ahead()  # every page cached, just written: nothing asked
        stage._ahead.join(10)
        assert started == []
        os.fsync(stage.fd)
        os.posix_fadvise(stage.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        stage.read_ahead()
        assert entered.wait(10)  # its thread found pages missing and asks for them
        stage.read_ahead()  # the first still runs: no second
        assert started == [(stage.size, len(view.trailer))] and stage.tail == len(view.trailer) > 0
        gate.set()
        stage._ahead.join(10)
        os.posix_fadvise(stage.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        stage.read_ahead()  # the next open: again
        stage._ahead.join(10)
        assert len(started) == 2
        stage.close()
        stage.read_ahead()  # closed: nothing, no error
        assert len(started) == 2
    finally:
        gate.set()
        view.close()
        files.close()
        copies.close()


def test_a_stage_being_written_tells_how_far_it_may_be_read_and_keeps_its_file_if_shared(tmp_path: Path) -> None:
    """Holds: SEMANTICS.md#views-parquet-early (the footer is written first, then windows from the
    first on; a stage that fails while handles read it never lends its file to another stage)"""
    from shufflefs.errors import StageError
    from shufflefs.stages.parquet_stage import StageWriter

    with views_of(tmp_path, epoch=3) as (make, copies, files):
        whole, part = make(), make()
        done = write_stage(whole, files)
        want = bytes(done.data)
        done.close()
        lay = part.layout
        assert lay.n_windows >= 3
        writer = StageWriter(part, files)
        tail = int(lay.trailer_offset)
        assert writer.written_end == len(part.header) == int(lay.window_starts[0])
        assert bytes(writer.data[tail:]) == want[tail:]  # the footer first: readers read it first
        assert writer.written(tail, lay.size) and writer.written(0, len(part.header))
        assert not writer.written(0, len(part.header) + 1) and not writer.written(tail - 1, lay.size)
        writer.shared = True
        copies.stop.set()  # the next window fails
        writer.work()
        assert writer.failed and writer.written_end == int(lay.window_starts[0])
        free, fd = len(files._free), writer.file.fd
        with pytest.raises(StageError):
            writer.finish()
        assert len(files._free) == free  # closed, its pages left to its readers, not lent to the next stage
        with pytest.raises(OSError):
            os.fstat(fd)


def test_windows_written_out_of_order_are_readable_once_those_before_are(tmp_path: Path) -> None:
    """Holds: SEMANTICS.md#views-parquet-early (the footer first, then the last window, then the
    others front to back; a range is readable once every window it touches is written)"""
    from shufflefs.stages.parquet_stage import StageWriter

    with views_of(tmp_path, epoch=3) as (make, _, files):
        view = make()
        writer = StageWriter(view, files)
        lay = view.layout
        starts, tail, n = lay.window_starts, int(lay.trailer_offset), lay.n_windows
        assert n >= 4
        writer._next = 2  # another thread took the last window and the first (in that order) and is at them
        done = threading.Thread(target=writer.work)
        done.start()
        done.join()
        assert writer.written_end == int(starts[0])  # windows 1 to n - 2 are written, not 0
        assert writer.written(int(starts[1]), int(starts[n - 1])) and writer.written(int(starts[2]) + 5, int(starts[3]))
        assert not writer.written(int(starts[0]), int(starts[1])) and not writer.written(int(starts[1]), tail)
        assert not writer.written(tail - (64 << 10), lay.size)  # a reader's first read waits for the last window
        writer._next = 0
        writer.work()  # the last window, the first, then the others again
        assert writer.written_end == tail and writer.written(0, lay.size)
        stage = writer.finish()
        assert bytes(stage.data[:len(view.header)]) == bytes(view.header) and len(stage.data) == lay.size
        stage.close()
