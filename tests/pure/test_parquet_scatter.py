"""Level: pure (no mount, no daemon).

A Parquet view's stage built from a decoded copy that is not in the page cache (a later mount's
kept copy, read from disk): the copy's largest value stream is read around the page cache and
each row's values put in place after the windows are written without them
(`stages.parquet_scatter`).  The stage holds the same bytes as one gathered from the copy in the
page cache, whatever the strategy and column types; a copy that cannot be read fails the stage
(EIO), never a stage with holes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from shufflefs.errors import StageError  # noqa: E402
from shufflefs.formats import make_format, scan_file  # noqa: E402
from shufflefs.sources.local import SourceFile  # noqa: E402
from shufflefs.stages import parquet_scatter  # noqa: E402
from shufflefs.stages.parquet_rows import RowCopies, RowCopy  # noqa: E402
from shufflefs.stages.parquet_stage import StageFiles, write_stage  # noqa: E402
from shufflefs.stages.parquet_view import ParquetLayout, ParquetView  # noqa: E402
from shufflefs.strategies import make_plan  # noqa: E402
from shufflefs.strategies.base import ShuffleSpec  # noqa: E402


def made_copy(src: Path, work: Path):
    """The file's index and a whole decoded copy of it at ``work/copy``, out of the page cache."""
    index = scan_file(src, make_format("parquet"))
    copies = RowCopies(work / "copies")
    copy = copies.acquire(str(src), index)
    copy.ensure(np.arange(len(index.footer.group_rows)), SourceFile(str(src), index.stamp))
    shutil.copyfile(copy.file, work / "copy")
    copies.close()
    pf.drop_from_page_cache(work / "copy")
    return index


def view_of(src: Path, index, copy: RowCopy, spec: ShuffleSpec, epoch: int) -> ParquetView:
    plan = make_plan(index, spec, epoch, 0, 1)
    return ParquetView(str(src), index, plan, ParquetLayout(index, plan), SourceFile(str(src), index.stamp),
                       copy, lambda: None)


def stage_bytes(view: ParquetView, files: StageFiles) -> bytes:
    stage = write_stage(view, files)
    try:
        return bytes(stage.data)
    finally:
        stage.close()


@pytest.mark.parametrize("strategy", ["stratified", "corgipile", "full"])
@pytest.mark.parametrize("kind", ["sorted", "types"])
def test_a_stage_from_a_copy_on_disk_holds_the_bytes_of_one_gathered(tmp_path: Path, strategy: str, kind: str,
                                                                      monkeypatch) -> None:
    src = tmp_path / "s.parquet"
    if kind == "sorted":
        pf.label_sorted(src, n=30_000, group_rows=4_000)
    else:  # strings, binary, lists, structs, nulls, dictionaries, timestamps, decimals
        blobs = [np.random.default_rng(i).bytes(2000 + i % 3000) for i in range(6_000)]  # encoded images, say
        pf.write_pyarrow(src, pf.arrow_table(6_000).append_column("blob", __import__("pyarrow").array(blobs)))
    index = made_copy(src, tmp_path)
    spec = ShuffleSpec(strategy=strategy, buffer=1 << 20)
    files = StageFiles(str(tmp_path))
    cold = RowCopy(str(src), index, str(tmp_path / "copy"), taken=True)
    try:
        leaf = parquet_scatter.deferred_leaf(view_of(src, index, cold, spec, 3))
        if not cold.reads_direct():
            pytest.skip("the copy's file system does not read around the page cache")
        assert leaf is not None and index.footer.leaves[leaf].dotted == ("text" if kind == "sorted" else "blob")
        runs = []
        run = parquet_scatter.Scatter.run
        monkeypatch.setattr(parquet_scatter.Scatter, "run", lambda self: (runs.append(len(self.pieces)), run(self)))
        scattered = stage_bytes(view_of(src, index, cold, spec, 3), files)
        assert len(runs) == 1 and runs[0] >= 1  # its values were read around the page cache
        monkeypatch.undo()
    finally:
        cold.close(lambda c: True)
    warm = RowCopy(str(src), index, str(tmp_path / "copy"), taken=True)
    try:
        os.posix_fadvise(os.open(tmp_path / "copy", os.O_RDONLY), 0, 0, os.POSIX_FADV_WILLNEED)
        bytes(warm.streams.data)  # every page cached: gathered as before
        view = view_of(src, index, warm, spec, 3)
        assert parquet_scatter.deferred_leaf(view) is None
        gathered = stage_bytes(view, files)
    finally:
        warm.close(lambda c: True)
        files.close()
    assert scattered == gathered
    rows = pq.read_table(src)
    got = pq.read_table(__import__("io").BytesIO(scattered))
    assert got.schema == rows.schema and got.num_rows == rows.num_rows
    assert sorted(got.column("id").to_pylist()) == sorted(rows.column("id").to_pylist())


def test_pieces_hold_every_row_once_and_no_row_is_cut() -> None:
    runs = np.array([0, 10, 5000, 5000, 9000, 30_000], np.int64)
    lens = np.array([10, 4990, 0, 4000, 21_000, 7], np.int64)
    with pytest.raises(ValueError, match="does not fit"):  # `Scatter` makes its pieces larger than any row
        parquet_scatter._pieces(runs, runs + lens, 8192)
    pieces = parquet_scatter._pieces(runs, runs + lens, 21_000 + parquet_scatter.DIRECT_ALIGN)
    got = np.concatenate([np.arange(a, b) for a, b, _ in pieces])
    assert got.tolist() == list(range(len(runs)))
    for a, b, at in pieces:
        assert at % parquet_scatter.DIRECT_ALIGN == 0 and at <= runs[a] and (runs + lens)[b - 1] <= at + 25_096


def test_a_copy_that_cannot_be_read_fails_the_stage_and_the_file_goes_back(tmp_path: Path) -> None:
    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=4_000)
    index = made_copy(src, tmp_path)
    files = StageFiles(str(tmp_path))
    copy = RowCopy(str(src), index, str(tmp_path / "copy"), taken=True)
    try:
        view = view_of(src, index, copy, ShuffleSpec(), 1)
        if parquet_scatter.deferred_leaf(view) is None:
            pytest.skip("the copy's file system does not read around the page cache")
        os.rename(tmp_path / "copy", tmp_path / "moved")  # the mapping holds it; a new open does not find it
        with pytest.raises(StageError, match="could not be read"):
            write_stage(view, files)
        assert view.writer is None and len(files._free) == 1  # given back for the next stage
        os.rename(tmp_path / "moved", tmp_path / "copy")
        again = view_of(src, index, copy, ShuffleSpec(), 1)
        assert pq.read_table(__import__("io").BytesIO(stage_bytes(again, files))).num_rows == 20_000
    finally:
        copy.close(lambda c: True)
        files.close()


def test_a_view_names_its_writer_only_once_it_knows_whether_reads_come_early(tmp_path: Path, monkeypatch) -> None:
    """An open on the event loop asks `view.writer.early_reads` while the stage is being made
    in a thread: every attribute it reads is set before the view names the writer."""
    src = pf.label_sorted(tmp_path / "s.parquet", n=20_000, group_rows=4_000)
    index = made_copy(src, tmp_path)
    files = StageFiles(str(tmp_path))
    copy = RowCopy(str(src), index, str(tmp_path / "copy"), taken=True)
    seen: list[object] = []
    leaf = parquet_scatter.deferred_leaf

    def slow_leaf(view: ParquetView) -> int | None:
        seen.append(view.writer)  # what an open on the loop finds meanwhile
        return leaf(view)
    try:
        view = view_of(src, index, copy, ShuffleSpec(), 1)
        monkeypatch.setattr(parquet_scatter, "deferred_leaf", slow_leaf)
        write_stage(view, files).close()
        assert seen == [None]
    finally:
        copy.close(lambda c: True)
        files.close()

