"""Level: pure (no mount, no daemon).

Every view of every strategy x format x epoch is a valid file holding exactly the source's records.

These run the real scanners and strategies together through `layout.render`, the reference that
the mounted tests compare reads against.
"""

from __future__ import annotations

import io
import struct
from collections import Counter

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shufflefs.formats import make_format
from shufflefs.index.table import RecordIndex
from shufflefs.windows.layout import render
from shufflefs.strategies import STRATEGIES, make_plan
from shufflefs.strategies.base import ShuffleSpec


def _records(index: RecordIndex, data: bytes) -> list[bytes]:
    return [data[a:b] for a, b in zip(index.bounds[:-1].tolist(), index.bounds[1:].tolist())]


def _masked(b: bytes) -> int:
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(payloads: list[bytes]) -> bytes:
    out = io.BytesIO()
    for p in payloads:
        n = struct.pack("<Q", len(p))
        out.write(n + struct.pack("<I", _masked(n)) + p + struct.pack("<I", _masked(p)))
    return out.getvalue()


def _npy(rows: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, rows)
    return buf.getvalue()


@st.composite
def source_files(draw):
    """(format name, params, file bytes) of a random small file of a random format."""
    kind = draw(st.sampled_from(["lines", "csv", "fixed", "npy", "tfrecord"]))
    n = draw(st.integers(0, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    rnd = np.random.default_rng(seed)
    if kind == "lines":
        lines = [b'{"i": %d, "pad": "%s"}' % (i, b"x" * int(rnd.integers(0, 300))) for i in range(n)]
        text = b"\n".join(lines) + (b"\n" if lines and draw(st.booleans()) else b"")
        return kind, {}, text
    if kind == "csv":
        rows = [b'%d,"a, ""quoted""\nfield",%s' % (i, b"y" * int(rnd.integers(0, 200))) for i in range(n)]
        return kind, {}, b"id,text,pad\n" + b"".join(r + b"\n" for r in rows)
    if kind == "fixed":
        size = int(rnd.integers(1, 200))
        header = int(rnd.integers(0, 40))
        return kind, {"record_size": size, "header_bytes": header}, rnd.bytes(header + n * size)
    if kind == "npy":
        shape = (n, int(rnd.integers(1, 5)), 3)
        return kind, {}, _npy(rnd.standard_normal(shape).astype(np.float32))
    payloads = [rnd.bytes(int(rnd.integers(0, 400))) for _ in range(n)]
    return kind, {}, _tfrecord(payloads)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=source_files(), epoch=st.integers(0, 3), block=st.sampled_from([64, 256, 4096]),
       buffer=st.sampled_from([64, 512, 0.25, 1.0]), seed=st.integers(0, 10))
def test_view_is_valid_file_with_same_records(strategy, src, epoch, block, buffer, seed):
    kind, params, data = src
    fmt = make_format(kind, params)
    arr = np.frombuffer(data, np.uint8)
    index = fmt.scan(arr, "src")
    spec = ShuffleSpec(strategy=strategy, seed=seed, block_size=block, buffer=buffer, page_size=128)
    plan = make_plan(index, spec, epoch)
    view = render(index, plan, data)

    assert len(view) == index.view_size == fmt.view_size(len(data), data[-1] if data else None)
    # the view is a valid file of its format: it scans cleanly, header first, trailer last
    vindex = fmt.scan(np.frombuffer(view, np.uint8), "view")
    assert view[: vindex.header_end] == data[: index.header_end]
    assert view[vindex.trailer_start:] == data[index.trailer_start:]
    assert vindex.n == index.n
    assert Counter(_records(vindex, view)) == Counter(_records(index, data))
    assert len(view) == len(data) and vindex.torn == index.torn  # a torn last line stays last, unchanged
    if index.torn:
        assert _records(vindex, view)[-1] == _records(index, data)[-1]
    # and the same inputs give the same bytes
    assert render(index, make_plan(index, spec, epoch), data) == view


def test_npy_view_loads_with_numpy():
    rnd = np.random.default_rng(3)
    rows = rnd.standard_normal((500, 7)).astype(np.float64)
    data = _npy(rows)
    fmt = make_format("npy", {})
    index = fmt.scan(np.frombuffer(data, np.uint8), "x.npy")
    plan = make_plan(index, ShuffleSpec("corgipile", seed=1, block_size=4096, buffer=8192), 2)
    loaded = np.load(io.BytesIO(render(index, plan, data)))
    assert loaded.shape == rows.shape and loaded.dtype == rows.dtype
    assert not np.array_equal(loaded, rows)
    assert np.array_equal(np.sort(loaded.view("V56").ravel()), np.sort(rows.view("V56").ravel()))


@pytest.mark.parametrize("strategy", ["full", "corgipile", "block", "lirs-page", "window"])
def test_epochs_give_different_views(strategy):
    lines = b"".join(b"record %05d\n" % i for i in range(2000))
    fmt = make_format("lines", {})
    index = fmt.scan(np.frombuffer(lines, np.uint8), "x.txt")
    spec = ShuffleSpec(strategy, seed=5, block_size=1024, buffer=4096, page_size=256)
    views = {render(index, make_plan(index, spec, e), lines) for e in range(3)}
    assert len(views) == 3
    assert lines not in views
