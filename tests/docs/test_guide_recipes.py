"""The user guide's recipes run as written, on generated data, through real mounts."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, shufflefs_mounts
from tests.docs.recipes import blocks, run

GUIDE = REPO / "docs" / "guide"


def test_blocks_and_their_directives(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("text\n\n```sh\necho one\n```\n<!-- output: one -->\n\n<!-- not run: needs a GPU -->\n"
                    "```python\nimport torch\n```\n\n```toml\nx = 1\n```\n")
    got = blocks(page)
    assert [(b.lang, b.runs, b.outputs, b.skip) for b in got] == [
        ("sh", True, ["one"], None), ("python", False, [], "needs a GPU"), ("toml", False, [], None)]
    assert run(got[0], tmp_path).strip() == "one"
    wrong = got[0]
    wrong.outputs = ["two"]
    with pytest.raises(AssertionError, match="did not print 'two'"):
        run(wrong, tmp_path)


def _hub_dataset(root: Path) -> None:
    """Three label-sorted shards as the Hub names them (2,000 rows each)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = root / "data"
    data.mkdir(parents=True)
    for i in range(3):
        ids = np.arange(i * 2000, (i + 1) * 2000)
        table = pa.table({"id": ids, "label": ids // 600, "text": [f"row {k} " * (k % 7 + 1) for k in ids]})
        pq.write_table(table, data / f"train-{i:05d}-of-00003.parquet", row_group_size=500)


def _corpus(root: Path) -> None:
    """4,000 label-sorted JSON lines compressed in frames of 500 lines."""
    import zstandard

    root.mkdir(parents=True)
    lines = [json.dumps({"id": k, "label": k // 400, "text": "word " * (k % 13 + 1)}) + "\n" for k in range(4000)]
    out = io.BytesIO()
    for a in range(0, len(lines), 500):
        out.write(zstandard.ZstdCompressor().compress("".join(lines[a: a + 500]).encode()))
    (root / "part-000.jsonl.zst").write_bytes(out.getvalue())


def test_formats_page(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("zstandard")
    _hub_dataset(tmp_path / "hub-dataset")
    _corpus(tmp_path / "corpus")
    page = blocks(GUIDE / "formats.md")
    assert sum(b.runs for b in page) >= 8
    try:
        printed = [run(b, tmp_path) for b in page if b.runs]
    finally:
        for mnt in shufflefs_mounts():
            if mnt.startswith(str(tmp_path)):
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, timeout=30)
    epochs = [line for out in printed for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and epochs[0] != epochs[1]  # each epoch its own order
