"""Fortran-order ``.npy`` arrays (pandas' ``to_numpy()`` saved by ``np.save``) through real mounts.

A Fortran array's view must be the C-order array of its rows in the order a C-order twin of it
gets: the same bytes as the twin's view (header included), for every strategy and epoch, for
rank shares, loader parts and pools of shards.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from test_mount import ARGS

from shufflefs.strategies import STRATEGIES

ROWS = 3000


def saved(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def frames() -> dict[str, np.ndarray]:
    """Fortran arrays as pandas writes them, and others, by name (no digits: no pools)."""
    rng = np.random.default_rng(5)
    df = pd.DataFrame(rng.random((ROWS, 40)))
    out = {
        "dbl": df.to_numpy(),  # float64, Fortran order
        "int": pd.DataFrame(rng.integers(-1e6, 1e6, (ROWS, 24)).astype("int32")).to_numpy(),
        "flag": pd.DataFrame(rng.random((ROWS, 9)) > 0.5).to_numpy(),
        "cube": np.asfortranarray(rng.random((ROWS // 3, 5, 7)).astype("float32")),
        "flat": np.asfortranarray(rng.random(ROWS)),
    }
    assert all(a.flags.f_contiguous for a in out.values())
    assert not out["dbl"].flags.c_contiguous and not out["cube"].flags.c_contiguous
    return out


def tree() -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    arrays = frames()
    files = {}
    for name, a in arrays.items():
        files[f"f_{name}.npy"] = saved(a)
        files[f"c_{name}.npy"] = saved(np.ascontiguousarray(a))
    assert b"'fortran_order': True" in files["f_dbl.npy"]
    return arrays, files


def rows(a: np.ndarray) -> list:
    return sorted(a.reshape(len(a), -1).tolist())


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_fortran_views_equal_their_c_twins(mount, strategy: str):
    arrays, files = tree()
    m = mount(files, *ARGS, "--no-pool", "--strategy", strategy)
    for epoch in (0, 1):
        m.set_epoch(epoch)
        for name, a in arrays.items():
            f, c = m.path(f"f_{name}.npy"), m.path(f"c_{name}.npy")
            assert f.read_bytes() == c.read_bytes(), (name, epoch)
            got = np.load(f)
            assert got.flags.c_contiguous and got.dtype == a.dtype and got.shape == a.shape
            assert np.array_equal(got, np.load(c))
            assert rows(got) == rows(a)
            assert np.array_equal(np.load(f, mmap_mode="r"), got)
            if a.ndim > 1 and strategy != "none":
                assert not np.array_equal(got, a), "rows are shuffled"


def test_rank_shares_and_parts_of_fortran_arrays(mount):
    arrays, files = tree()
    first = mount(files, *ARGS, "--no-pool", "--rank", "0", "--world-size", "2")
    second = mount(None, *ARGS, "--no-pool", "--rank", "1", "--world-size", "2", src=first.src, name="r1")
    for epoch in (0, 1):
        for m in (first, second):
            m.set_epoch(epoch)
        for name, a in arrays.items():
            shares = [np.load(m.path(f"f_{name}.npy")) for m in (first, second)]
            assert [s.tobytes() for s in shares] == [np.load(m.path(f"c_{name}.npy")).tobytes() for m in (first, second)]
            assert rows(np.concatenate(shares)) == rows(a), "the ranks hold every row once"
            parts = [np.load(first.path(f".parts/3/{i}/f_{name}.npy")) for i in range(3)]
            twins = [np.load(first.path(f".parts/3/{i}/c_{name}.npy")) for i in range(3)]
            assert all(np.array_equal(p, t) for p, t in zip(parts, twins))
            assert rows(np.concatenate(parts)) == rows(shares[0])
            assert np.array_equal(np.load(first.path(f".parts/3/1/f_{name}.npy"), mmap_mode="r"), parts[1])


def test_pool_of_fortran_shards(mount):
    rng = np.random.default_rng(9)
    arrays = {f"data_{i}.npy": pd.DataFrame(rng.random((n, 6))).to_numpy() for i, n in enumerate((900, 130, 520))}
    files = {name: saved(a) for name, a in arrays.items()}
    twin = {name: saved(np.ascontiguousarray(a)) for name, a in arrays.items()}
    m = mount(files, *ARGS, "--block-size", "1KiB", "--buffer", "4KiB")
    c = mount(twin, *ARGS, "--block-size", "1KiB", "--buffer", "4KiB", name="twin")
    for epoch in (0, 1):
        m.set_epoch(epoch)
        c.set_epoch(epoch)
        loaded = [np.load(m.path(n)) for n in sorted(arrays)]
        assert [x.tobytes() for x in loaded] == [np.load(c.path(n)).tobytes() for n in sorted(arrays)]
        assert rows(np.concatenate(loaded)) == rows(np.concatenate(list(arrays.values())))
        assert np.array_equal(np.load(m.path("data_1.npy"), mmap_mode="r"), loaded[1])


def test_a_pool_of_c_and_fortran_shards_is_refused(mount):
    a = np.arange(60.0).reshape(20, 3)
    m = mount({"data_0.npy": saved(a), "data_1.npy": saved(np.asfortranarray(a))}, *ARGS)
    with pytest.raises(OSError):
        m.path("data_0.npy").read_bytes()
    assert any("data_1.npy" in line and "--no-pool" in line for line in m.stats()["last_errors"])
