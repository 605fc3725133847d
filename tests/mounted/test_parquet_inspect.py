"""Level: mounted (real FUSE mounts, real readers).

``shufflefs inspect FILE.parquet --label-field COLUMN`` measures the label mix of every strategy
with that column as the label: on a label-sorted file the default strategy mixes within twice the
mix of ``full`` and ``none`` does not; of a mounted view (also a pooled shard) it measures the
order the view holds, as pyarrow and pandas read it.  Without a label it says what it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

import parquet_files as pf  # noqa: E402
from shufflefs.quality.metrics import label_mix_tv  # noqa: E402

N, GROUP = 20_000, 2_000
ARGS = ("--buffer", "2MiB", "--seed", "3")


def inspect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", "inspect", *map(str, args)], capture_output=True,
                          text=True, timeout=180, cwd=REPO)


def report(*args: str) -> dict:
    r = inspect(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pqinspect") / "src"
    d.mkdir()
    pf.label_sorted(d / "sorted.parquet", n=N, group_rows=GROUP)
    return d


def tv_of(labels) -> float:
    """The label mix per 100 rows of rows in the order given."""
    codes = np.unique(np.asarray(labels), return_inverse=True)[1].reshape(-1)
    return label_mix_tv(np.arange(len(codes)), codes, 100)


def test_label_field_names_a_column_and_the_default_mixes_within_twice_full(src):
    """Holds: SEMANTICS.md#views-parquet-inspect"""
    out = report(src / "sorted.parquet", "--label-field", "label", *ARGS)
    assert out["format"] == "parquet" and out["records"] == N and out["labels"] == [str(i) for i in range(10)]
    tv = {name: s["label_tv"] for name, s in out["strategies"].items()}
    assert tv["stratified"] <= 2 * tv["full"], tv  # the default strategy
    assert tv["none"] > 0.8 > 2 * tv["full"], tv  # source order: runs of one label
    by_dict = report(src / "sorted.parquet", "--label-column", "lang", *ARGS, "--strategies", "none,full")
    assert by_dict["labels"] == sorted(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota",
                                         "kappa"])  # a dictionary-encoded column: its values


def test_without_a_label_it_says_what_it_needs(src):
    """Holds: SEMANTICS.md#views-parquet-inspect"""
    r = inspect(src / "sorted.parquet", "--strategies", "none,full")
    assert r.returncode == 0, r.stderr
    assert "--label-field COLUMN" in r.stdout and "id, label, text, score, tags, lang" in r.stdout
    assert "label mix" not in r.stdout.split("\n\n", 1)[1]  # no label row in the table
    r = inspect(src / "sorted.parquet", "--label-field", "class")
    assert r.returncode != 0 and "no column 'class'" in r.stderr and "label, text" in r.stderr
    r = inspect(src / "sorted.parquet", "--label-byte", "0")
    assert r.returncode != 0 and "--label-field COLUMN" in r.stderr
    r = inspect(src / "sorted.parquet", "--label-field", "tags")
    assert r.returncode != 0 and "'tags' is of type list" in r.stderr


def test_a_mounted_view_is_measured_in_the_order_it_holds(mount, src):
    """Holds: SEMANTICS.md#views-parquet-inspect"""
    m = mount(None, *ARGS, src=src)
    for epoch in (0, 1):
        m.set_epoch(epoch)
        view = m.path("sorted.parquet")
        out = report(view, "--label-field", "label")
        (measured,) = out["strategies"].values()
        assert out["mounted"] and out["epoch"] == epoch and out["records"] == N
        labels = pq.read_table(view, columns=["label"]).column(0).to_numpy()
        assert measured["label_tv"] == pytest.approx(tv_of(labels), abs=1e-12)
        assert list(pd.read_parquet(view, columns=["label"])["label"]) == labels.tolist()
        assert measured["label_tv"] <= 2 * out["uniform"]["label_tv"]
        r = inspect(view, "--verify")
        assert r.returncode != 0 and "re-encodes its rows" in r.stderr
    r = inspect(view)
    assert r.returncode == 0 and "--label-field COLUMN" in r.stdout, r.stderr


def test_a_pooled_shard_is_measured_as_its_share(mount, tmp_path, src):
    """Holds: SEMANTICS.md#views-parquet-inspect"""
    whole = pq.read_table(src / "sorted.parquet")
    d = tmp_path / "pool"
    d.mkdir()
    names = [f"train-{i:05d}-of-00002.parquet" for i in range(2)]
    for i, name in enumerate(names):
        pq.write_table(whole.slice(i * N // 2, N // 2), d / name, row_group_size=GROUP)
    m = mount(None, *ARGS, src=d)
    for name in names:
        out = report(m.path(name), "--label-field", "label")
        (column, measured), = out["strategies"].items()
        labels = pq.read_table(m.path(name), columns=["label"]).column(0).to_numpy()
        assert "shard" in column and out["records"] == len(labels) > 0
        assert len(set(labels.tolist())) == 10  # rows of both members
        assert measured["label_tv"] == pytest.approx(tv_of(labels), abs=1e-12)
