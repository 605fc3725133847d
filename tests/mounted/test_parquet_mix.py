"""Level: mounted (real FUSE mounts, real readers).

A mixture (``[[mix]]``) of Parquet files is served as ``.mix/NAME/`` shards that are Parquet files
of the files' schema, read by pyarrow and pandas: each epoch holds exactly the mixture's quota
of rows from each source (a source smaller than its quota repeats rows, each whole), in an order
of its own; rank shares hold the blend's rows as often as the blend does; files of another
schema refuse the mount naming the files."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

from shufflefs.strategies.mixture import quotas  # noqa: E402

ARGS = ("--seed", "4", "--block-size", "4KiB", "--buffer", "64KiB")
SAMPLES, SHARDS = 6_000, 3
SIZES = {"a/x.parquet": 3_000, "a/y.parquet": 2_000, "b/z.parquet": 900}
WEIGHTS = {"a/*.parquet": 3, "b/*.parquet": 1}


def table(source: str, first: int, n: int, extra: bool = False):
    k = np.arange(first, first + n)
    cols = {"src": pa.array([source] * n).dictionary_encode(), "k": k,
            "text": [f"{source}-{i}|" * (1 + i % 7) for i in k.tolist()],
            "tags": pa.array([[int(i)] * int(i % 3) for i in k], pa.list_(pa.int64()))}
    if extra:
        cols["score"] = np.ones(n)
    return pa.table(cols).replace_schema_metadata({"origin": source})


def write_src(root: Path, odd: bool = False) -> Path:
    first = 0
    for rel, n in SIZES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table(rel[0], first, n, extra=odd and rel.startswith("b/")), root / rel, row_group_size=400)
        first += n
    return root


def config(root: Path, extra: str = "") -> Path:
    text = f'[[mix]]\nname = "blend"\nsamples = {SAMPLES}\nshards = {SHARDS}\n{extra}'
    for glob, weight in WEIGHTS.items():
        text += f'[[mix.source]]\nglob = "{glob}"\nweight = {weight}\n'
    (root / "mix.toml").write_text(text)
    return root / "mix.toml"


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_src(tmp_path_factory.mktemp("pqmix") / "src")


def shards(m) -> list[Path]:
    d = m.path(".mix/blend")
    return [d / n for n in sorted(os.listdir(d))]


def blend(m):
    return pa.concat_tables([pq.read_table(p) for p in shards(m)])


def test_a_mixture_of_parquet_files_is_parquet_shards_with_the_quotas(mount, src, tmp_path):
    """Holds: SEMANTICS.md#mix-parquet"""
    m = mount(None, *ARGS, "--config", str(config(tmp_path)), src=src)
    names = [p.name for p in shards(m)]
    assert names == [f"blend-{i:05d}-of-{SHARDS:05d}.parquet" for i in range(SHARDS)]
    schema = pq.read_schema(src / "a/x.parquet")
    want = dict(zip("ab", quotas(SAMPLES, list(WEIGHTS.values())).tolist()))
    orders, given = [], collections.Counter()
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        tables = [pq.read_table(p) for p in shards(m)]
        assert all(t.schema.equals(schema, check_metadata=True) for t in tables)
        assert all(t.num_rows > 0 for t in tables)
        t = pa.concat_tables(tables)
        rows = list(zip(t.column("src").to_pylist(), t.column("k").to_pylist()))
        assert collections.Counter(s for s, _ in rows) == want  # each source's quota, exactly
        assert all(text == f"{s}-{k}|" * (1 + k % 7) for (s, k), text in zip(rows, t.column("text").to_pylist()))
        assert all(tags == [k] * (k % 3) for (_, k), tags in zip(rows, t.column("tags").to_pylist()))
        if epoch == 0:  # the first pass over each source: 4,500 of a's 5,000 rows; b's 900, then 600 again
            times = collections.Counter(rows)
            assert max(n for (s, _), n in times.items() if s == "a") == 1
            assert sorted(collections.Counter(n for (s, _), n in times.items() if s == "b").items()) == [(1, 300), (2, 600)]
        given.update(rows)
        frames = pd.concat([pd.read_parquet(p) for p in shards(m)])
        assert list(zip(frames["src"].astype(str), frames["k"])) == rows
        orders.append(rows)
    assert orders[0] != orders[1] != orders[2]
    # three epochs are 5 passes over b (4,500 rows of 900) and 2.7 over a (13,500 of 5,000)
    assert sorted(collections.Counter(n for (s, _), n in given.items() if s == "b").items()) == [(5, 900)]
    assert {n for (s, _), n in given.items() if s == "a"} == {2, 3} and len(given) == 5_900
    info = m.xattr("info", ".mix/blend/" + names[0])
    assert '"parquet"' in info and '"mixture": "blend"' in info


def test_rank_shares_hold_the_blend(mount, src, tmp_path):
    """Holds: SEMANTICS.md#mix-parquet"""
    cfg = config(tmp_path)
    whole = mount(None, *ARGS, "--config", str(cfg), src=src)
    ranks = [mount(None, *ARGS, "--config", str(cfg), "--world-size", "2", "--rank", str(r), src=src)
             for r in range(2)]
    def rows(m):
        t = blend(m)
        return collections.Counter(zip(t.column("src").to_pylist(), t.column("k").to_pylist()))
    parts = [rows(r) for r in ranks]
    assert parts[0] + parts[1] == rows(whole)
    assert abs(sum(parts[0].values()) - sum(parts[1].values())) <= 1


def test_files_of_another_schema_refuse_the_mount_naming_them(tmp_path):
    """Holds: SEMANTICS.md#mix-parquet, SEMANTICS.md#mix-refused"""
    src = write_src(tmp_path / "src", odd=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt), "--config",
                        str(config(tmp_path)), "--cache-dir", str(tmp_path / "cache")], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    try:
        assert r.returncode != 0, r.stderr
        assert "b/z.parquet" in r.stderr and "a/x.parquet" in r.stderr and "share one schema" in r.stderr, r.stderr
        assert "src, k, text, tags, score" in r.stderr
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)])


def test_inspect_measures_a_shard_by_a_column(mount, src, tmp_path):
    """Holds: SEMANTICS.md#mix-parquet, SEMANTICS.md#views-parquet-inspect"""
    import json

    from shufflefs.quality.metrics import label_mix_tv

    m = mount(None, *ARGS, "--config", str(config(tmp_path)), src=src)
    path = shards(m)[1]
    r = subprocess.run([sys.executable, "-m", "shufflefs", "inspect", str(path), "--label-field", "src", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    column = next(c for c in out["strategies"] if "shard 1/3" in c)
    held = pq.read_table(path, columns=["src"]).column(0).to_pylist()
    codes = np.array([h == "b" for h in held], np.int64)
    assert out["labels"] == ["a", "b"]
    assert out["strategies"][column]["label_tv"] == pytest.approx(label_mix_tv(np.arange(len(codes)), codes, 100))
