"""Level: pure (no FUSE).

The order of the files a mount read, kept for the next mount of the same root
(`stages.read_orders`): written whole or not at all, read back only as it was written, and
nothing that names a path outside the root, or is not a plain file, is trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shufflefs.stages.read_orders import MAX_BYTES, MAX_FILES, load_order, order_file, save_order

FILES = [("train-00001-of-00004.parquet", 0, 1), ("sub dir/ä b.parquet", 2, 4), ("x.parquet", 0, 1),
         ("not utf-8 \udcff.parquet", 0, 1)]  # a name of bytes that are not UTF-8, as os.listdir gives it


def test_an_order_reads_back_as_written_for_its_root_only(tmp_path: Path):
    d = str(tmp_path / "orders")
    assert load_order(d, "/data") == []  # none yet
    assert save_order(d, "/data", FILES)
    assert load_order(d, "/data") == FILES
    assert load_order(d, "/other") == []
    assert save_order(d, "/data", FILES[:1])  # replaced whole
    assert load_order(d, "/data") == FILES[:1]
    assert [p for p in os.listdir(d) if p.startswith(".")] == []  # no temporary left


def test_a_long_order_keeps_its_first_files(tmp_path: Path):
    d = str(tmp_path)
    files = [(f"s{i}.parquet", 0, 1) for i in range(MAX_FILES + 5)]
    assert save_order(d, "/data", files)
    assert load_order(d, "/data") == files[:MAX_FILES]


@pytest.mark.parametrize("files", [
    [["../outside.parquet", 0, 1]], [["/etc/passwd", 0, 1]], [["a/../../b", 0, 1]], [["a//b", 0, 1]],
    [["", 0, 1]], [["a\0b", 0, 1]], [["a", 1, 1]], [["a", -1, 1]], [["a", 0, 1 << 21]], [["a", "0", 1]],
    [["a", 0]], [["a", 0, 1, 2]], [[1, 0, 1]], [["a", 0, True]], "a", None,
])
def test_an_order_naming_anything_but_views_of_the_root_is_not_read_at_all(tmp_path: Path, files):
    d = str(tmp_path)
    Path(order_file(d, "/data")).write_text(json.dumps({"v": 1, "source": "/data",
                                                        "files": [["ok.parquet", 0, 1], *files]
                                                        if isinstance(files, list) else files}))
    assert load_order(d, "/data") == []


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b"[]", b'{"v": 2, "source": "/data", "files": []}',
                                  b'{"v": 1, "source": "/other", "files": [["a", 0, 1]]}',
                                  b'{"v": 1, "source": "/data", "files": [["a", 0, 1]]}' + b" " * MAX_BYTES])
def test_a_damaged_or_foreign_order_is_ignored(tmp_path: Path, body: bytes):
    d = str(tmp_path)
    Path(order_file(d, "/data")).write_bytes(body)
    assert load_order(d, "/data") == []


def test_an_order_that_is_a_fifo_a_link_or_a_directory_is_not_opened_for_long(tmp_path: Path):
    d = str(tmp_path)
    path = order_file(d, "/data")
    os.mkfifo(path)  # a blocking open would hang the mount's start
    assert load_order(d, "/data") == []
    os.unlink(path)
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"v": 1, "source": "/data", "files": [["a", 0, 1]]}))
    os.symlink(real, path)
    assert load_order(d, "/data") == []
    os.unlink(path)
    os.mkdir(path)
    assert load_order(d, "/data") == []
    assert not save_order(d, "/data", FILES)  # cannot replace a directory: not kept, no error


def test_an_order_that_cannot_be_written_is_not_an_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not save_order(str(blocker / "orders"), "/data", FILES)
