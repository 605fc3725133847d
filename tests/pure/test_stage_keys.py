"""Level: pure (no mount, no daemon).

Stages kept whole from one mount to the next (`stages.stage_keys`, `KeptCopies.take_stage`,
`StageFiles.take_kept`): a stage is known by a key of all its bytes follow from (the source's
version, the rows' order, the view's header and footer, the boot), so a key matches only a stage
of the same bytes; a kept file whose size or modification time moved is not taken; a file taken
to be written loses its key first; and a spare holding a stage is written over last."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from shufflefs.index.table import SourceStamp
from shufflefs.stages import stage_keys
from shufflefs.stages.kept_copies import KeptCopies
from shufflefs.stages.stage_keys import stage_key


def fake_view(order: np.ndarray, header: bytes = b"PAR1", trailer: bytes = b"footerPAR1",
              stamp: SourceStamp | None = SourceStamp(100, 1, 2, 3), path: str = "/d/a.parquet") -> SimpleNamespace:
    return SimpleNamespace(path=path, index=SimpleNamespace(stamp=stamp), header=header, trailer=trailer,
                           ids_in_order=lambda: iter(np.array_split(order, 3)))


def test_a_stage_key_changes_with_anything_its_bytes_follow_from(tmp_path: Path, monkeypatch):
    order = np.arange(1000, dtype=np.int64)
    key = stage_key(fake_view(order))
    assert key is not None and key == stage_key(fake_view(order.copy()))
    swapped = order.copy()
    swapped[[10, 11]] = swapped[[11, 10]]
    others = [fake_view(swapped), fake_view(order, header=b"PAR2"), fake_view(order, trailer=b"footerPAR2"),
              fake_view(order, stamp=SourceStamp(100, 2, 2, 3)), fake_view(order, path="/d/b.parquet")]
    keys = {stage_key(v) for v in others}
    assert len(keys) == len(others) and key not in keys
    boot = tmp_path / "boot_id"
    boot.write_text("another-boot\n")
    monkeypatch.setattr(stage_keys, "BOOT_ID", str(boot))
    assert stage_key(fake_view(order)) not in (key, None)  # a reboot: nothing kept before matches
    monkeypatch.setattr(stage_keys, "BOOT_ID", str(tmp_path / "none"))
    assert stage_key(fake_view(order)) is None  # no boot id: nothing is kept
    monkeypatch.undo()
    assert stage_key(fake_view(order, stamp=None)) is None


def test_a_view_gives_its_rows_in_order_the_same_with_its_order_kept_or_dropped(tmp_path: Path):
    pq = pytest.importorskip("pyarrow.parquet")
    import parquet_files as pf
    from shufflefs.formats import make_format, scan_file
    from shufflefs.sources.local import SourceFile
    from shufflefs.stages.parquet_rows import RowCopies
    from shufflefs.stages.parquet_view import ParquetLayout, ParquetView
    from shufflefs.strategies import make_plan
    from shufflefs.strategies.base import ShuffleSpec

    src = pf.label_sorted(tmp_path / "s.parquet", n=30_000, group_rows=3_000)
    index = scan_file(src, make_format("parquet"))
    copies = RowCopies(tmp_path / "copies")
    try:
        copy = copies.acquire(str(src), index)
        plan = make_plan(index, ShuffleSpec(buffer=1 << 20), 2, 0, 1)
        view = ParquetView(str(src), index, plan, ParquetLayout(index, plan), SourceFile(str(src), index.stamp),
                           copy, lambda: None)
        kept = np.concatenate(list(view.ids_in_order()))
        key = stage_key(view)
        view.drop_order()  # as after a stage is written: the plan's windows are made again
        assert np.array_equal(np.concatenate(list(view.ids_in_order())), kept)
        assert stage_key(view) == key
        assert np.array_equal(np.sort(kept), np.arange(pq.ParquetFile(src).metadata.num_rows))
        view.close()
    finally:
        copies.close()


def spare(tmp_path: Path, name: str, data: bytes) -> int:
    path = tmp_path / name
    path.write_bytes(data)
    return os.open(path, os.O_RDWR)


def test_a_kept_stage_is_taken_by_its_key_once_and_never_when_its_file_moved(tmp_path: Path):
    keeps = KeptCopies(str(tmp_path / "root"), lambda: None)
    fd = spare(tmp_path, "a", b"stage-a" * 100)
    assert keeps.keep_spare(fd, str(tmp_path / "a"), "kaaaa")
    os.close(fd)
    assert keeps.take_stage(str(tmp_path / "t0"), "kbbbb", 700) is None  # another stage's key
    assert [p.name.split(".")[0] for p in Path(keeps.dir).iterdir()] == ["spare-kaaaa"]  # still there
    got = keeps.take_stage(str(tmp_path / "t2"), "kaaaa", 700)
    assert got is not None and os.pread(got, 7, 0) == b"stage-a"
    os.close(got)
    assert keeps.take_stage(str(tmp_path / "t3"), "kaaaa", 700) is None  # taken once
    fd = spare(tmp_path, "b", b"stage-b" * 100)
    assert keeps.keep_spare(fd, str(tmp_path / "b"), "kbbbb")
    os.close(fd)
    assert keeps.take_stage(str(tmp_path / "t4"), "kbbbb", 701) is None  # not the size its key implies

    def no_key_left() -> None:
        names = [p.name.split(".")[0] for p in Path(keeps.dir).iterdir()]
        assert len(names) == 1 and not names[0].startswith("spare-k") and names[0].startswith("spare-"), names
    no_key_left()  # left as a spare to write into, holding no stage known
    assert keeps.take_stage(str(tmp_path / "t5"), "kbbbb", 700) is None
    fd = spare(tmp_path, "c", b"stage-c" * 100)
    assert keeps.keep_spare(fd, str(tmp_path / "c"), "kcccc")
    os.close(fd)
    kept = next(p for p in Path(keeps.dir).iterdir() if p.name.startswith("spare-kcccc"))
    with open(kept, "r+b") as f:  # written after it was kept: its modification time moves
        f.write(b"X")
    os.utime(kept, ns=(kept.stat().st_atime_ns, kept.stat().st_mtime_ns + 1))
    assert keeps.take_stage(str(tmp_path / "t6"), "kcccc", 700) is None
    assert not [p for p in Path(keeps.dir).iterdir() if p.name.startswith("spare-k")]
    again = keeps.take_spare(str(tmp_path / "t7"), 700)
    assert again is not None
    os.close(again)


def test_a_spare_holding_a_stage_is_written_over_last(tmp_path: Path):
    keeps = KeptCopies(str(tmp_path / "root"), lambda: None)
    for name, key in (("held", "kcccc"), ("plain", None)):
        fd = spare(tmp_path, name, name.encode() * 200)
        assert keeps.keep_spare(fd, str(tmp_path / name), key)
        os.close(fd)
    first = keeps.take_spare(str(tmp_path / "w1"), 800)
    assert first is not None and os.pread(first, 5, 0) == b"plain"
    second = keeps.take_spare(str(tmp_path / "w2"), 800)
    assert second is not None and os.pread(second, 4, 0) == b"held"  # when nothing else is left
    for fd in (first, second):
        os.close(fd)


def test_stage_files_give_a_kept_stage_back_by_its_key_and_forget_it_when_rewritten(tmp_path: Path):
    from shufflefs.stages.parquet_stage import StageFiles

    files = StageFiles(str(tmp_path))
    a = files.take(4096)
    a.resize(4096)
    os.pwrite(a.fd, b"epoch 3", 0)
    a.key = "k" + hashlib.blake2b(b"3").hexdigest()
    files.give_back(a)
    assert files.take_kept("k-other", 4096) is None and files.take_kept(a.key, 4095) is None
    got, origin = files.take_kept(a.key, 4096)
    assert got is a and origin == "earlier in this mount" and files.kept == 1
    files.give_back(got)
    again = files.take(4096)  # to be written: what it held is not known any more
    assert again is a and again.key is None
    files.give_back(again)
    assert files.take_kept("k" + hashlib.blake2b(b"3").hexdigest(), 4096) is None
    files.close()
