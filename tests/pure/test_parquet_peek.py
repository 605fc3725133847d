"""Level: pure (no mount, no daemon).

`ParquetView.peek`, what a read far from any reader gets instead of a whole window: the bytes of
any range of any window, encoded from the pages it falls in only, are the window's bytes there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402
from shufflefs.formats import make_format, scan_file  # noqa: E402
from shufflefs.sources.local import SourceFile  # noqa: E402
from shufflefs.stages.parquet_rows import RowCopies  # noqa: E402
from shufflefs.strategies import make_plan  # noqa: E402
from shufflefs.strategies.base import ShuffleSpec  # noqa: E402
from shufflefs.stages import parquet_view  # noqa: E402
from shufflefs.stages.parquet_view import ParquetLayout, ParquetView  # noqa: E402


@pytest.mark.parametrize("strategy", ["stratified", "full"])
def test_a_peek_is_the_window_there(tmp_path: Path, monkeypatch, strategy: str) -> None:
    monkeypatch.setattr(parquet_view, "WINDOW_BYTES", 256 << 10)  # many windows of several pages
    src = pf.write_pyarrow(tmp_path / "t.parquet")
    index = scan_file(src, make_format("parquet"))
    plan = make_plan(index, ShuffleSpec(strategy=strategy, buffer=1 << 20), 3, 0, 1)
    layout = ParquetLayout(index, plan)
    assert layout.n_windows > 4
    copies = RowCopies(tmp_path / "copies")
    copy = copies.acquire(str(src), index)
    view = ParquetView(str(src), index, plan, layout, SourceFile(str(src), index.stamp), copy,
                       lambda: copies.release(copy))
    rng = np.random.default_rng(0)
    try:
        peeked = 0
        for k in rng.permutation(layout.n_windows)[:12].tolist():
            size = layout.window_size(k)
            # before and after the window is loaded: a peek fills the copy as a load does
            spans = [(0, min(size, 4096)), (size - 1, size), (0, size), (size // 2, size // 2)]
            spans += [tuple(sorted(rng.integers(0, size + 1, 2).tolist())) for _ in range(6)]
            got = [bytes(view.peek(k, a, b)) for a, b in spans]
            whole, _ = view.load_window(k)
            for (a, b), g in zip(spans, got):
                assert g == bytes(whole[a:b]), (k, a, b)
                peeked += b - a
        assert peeked > 0
        with pytest.raises(ValueError):
            view.peek(0, 0, layout.window_size(0) + 1)
    finally:
        view.close()
        copies.close()
