"""Level: pure (no mount, no daemon).

`windows.layout.assemble_steps` (how windows of compressed files are built: their runs fetched a
few MiB at a time) gives the bytes `assemble` gives, for any records, repeats and step size, and
fetches no step larger than it needs."""

from __future__ import annotations

import numpy as np
import pytest

from shufflefs.index.table import RecordIndex
from shufflefs.windows.layout import assemble, assemble_steps, slice_fetch


@pytest.mark.parametrize("seed", range(20))
def test_the_same_bytes_as_assemble(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    bounds = np.concatenate(([0], np.cumsum(rng.integers(1, 900, n)))).astype(np.int64)
    data = rng.integers(0, 256, int(bounds[-1]), dtype=np.uint8)
    index = RecordIndex(int(bounds[-1]), bounds)
    ids = rng.permutation(n)[: int(rng.integers(0, n + 1))] if n else np.zeros(0, np.int64)
    if seed % 3 == 0 and len(ids):
        ids = np.concatenate((ids, ids[:7]))  # a mixture's records taken twice
    step = int(rng.integers(1, 60_000))
    fetched = []

    def fetch(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        fetched.append(int((ends - starts).sum()))
        return slice_fetch(data)(starts, ends)

    got = assemble_steps(index, ids, fetch, step=step)
    assert np.array_equal(got, assemble(index, ids, slice_fetch(data)))
    assert not fetched or max(fetched) < step + 900  # a step, and the record that crosses its end


def test_a_stepwise_window_fetches_into_one_buffer() -> None:
    """`assemble` of a stepwise source hands its ``read_runs`` one buffer, grown when a step
    needs more, and builds the same window as from fresh buffers."""
    rng = np.random.default_rng(7)
    bounds = np.concatenate(([0], np.cumsum(rng.integers(1, 1500, 40_000)))).astype(np.int64)  # 30 MB: 4 steps
    data = rng.integers(0, 256, int(bounds[-1]), dtype=np.uint8)
    index = RecordIndex(int(bounds[-1]), bounds)
    ids = rng.permutation(40_000)
    buffers = []

    def read_runs(starts: np.ndarray, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        got = slice_fetch(data)(starts, ends)
        assert out is not None and len(out) >= len(got)
        buffers.append(out.__array_interface__["data"][0])
        out[: len(got)] = got
        return out[: len(got)]

    got = assemble(index, ids, read_runs, stepwise=True)
    assert np.array_equal(got, assemble(index, ids, slice_fetch(data)))
    assert len(buffers) > 2 and len(set(buffers)) < len(buffers)
