"""Level: mounted (real FUSE mounts, real readers).

What the mount does with any file's records, done with a Parquet file's rows: rank shares that
hold every row exactly once, loader parts of a share, an interrupted epoch resumed on another
layout, and ranks balanced by a numeric column (``--balance-field``).  Every share is a valid
Parquet file with the source's schema, read by pyarrow."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import parquet_files as pf  # noqa: E402

ARGS = ("--seed", "9", "--buffer", "1MiB")
NAME = "sorted.parquet"
ROWS = 20_000


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pqshares")
    pf.label_sorted(d / NAME, n=ROWS, group_rows=3_000)
    return d


def ids(path: Path) -> list[int]:
    table = pq.read_table(path)
    assert table.schema.names == ["id", "label", "text", "score", "tags", "lang"]
    return table.column("id").to_pylist()


def test_ranks_and_their_parts_hold_every_row_once(mount, src):
    """Holds: SEMANTICS.md#ranks-share, SEMANTICS.md#ranks-parts, SEMANTICS.md#views-parquet"""
    ranks = [mount(None, *ARGS, "--rank", str(r), "--world-size", "3", src=src, name="r") for r in range(3)]
    for epoch in (0, 1):
        shares = []
        for m in ranks:
            m.set_epoch(epoch)
            share = ids(m.path(NAME))
            parts = [ids(m.path(f".parts/2/{i}/{NAME}")) for i in range(2)]
            assert sorted(parts[0] + parts[1]) == sorted(share) and not set(parts[0]) & set(parts[1])
            assert int(m.xattr("records", NAME)) == len(share)
            shares.append(share)
        assert sorted(sum(shares, [])) == list(range(ROWS))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        if epoch == 0:
            first = shares
    assert shares != first


def shufflefs(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_an_epoch_resumes_on_another_layout_with_every_row_once(mount, src, tmp_path):
    """Two ranks stop mid-epoch after some rows; one rank of two loader parts resumes: the rows
    consumed and the rows the resumed views show are the epoch's rows, each once.
    Holds: SEMANTICS.md#resume-once, SEMANTICS.md#resume-other"""
    epoch = 6
    two = [mount(None, *ARGS, "--rank", str(r), "--world-size", "2", src=src, name="two") for r in range(2)]
    whole = []
    for m in two:
        m.set_epoch(epoch)
        whole.append(ids(m.path(NAME)))
    consumed = [1_234, 4_321]
    state = {"epoch": epoch, "views": {NAME: [{"world_size": 2, "parts": 1, "consumed": [[c] for c in consumed]}]}}
    one = mount(None, *ARGS, src=src, name="one")
    f = tmp_path / "state.json"
    f.write_text(json.dumps(state))
    r = shufflefs("epoch", one.path(), epoch, "--resume", f)
    assert r.returncode == 0, r.stderr
    rest = ids(one.path(NAME))
    assert rest == whole[0][consumed[0]:] + whole[1][consumed[1]:]  # whole stretches, in rank order
    parts = [ids(one.path(f".parts/2/{i}/{NAME}")) for i in range(2)]
    assert parts[0] + parts[1] == rest
    done = whole[0][: consumed[0]] + whole[1][: consumed[1]]
    assert collections.Counter(done + rest) == collections.Counter(range(ROWS))


def test_ranks_balanced_by_a_column_pair_rows_of_similar_cost(mount, tmp_path):
    """``--balance-field`` names a numeric column: the i-th row of rank 0 never costs more than
    rank 1's, and every row is given once.  Holds: SEMANTICS.md#ranks-share"""
    d = tmp_path / "src"
    d.mkdir()
    rng = np.random.default_rng(2)
    n = 3_001
    tokens = rng.integers(1, 500, n)
    pq.write_table(pa.table({"id": np.arange(n), "tokens": tokens, "text": ["t" * int(t) for t in tokens]}),
                   d / "c.parquet", row_group_size=700)
    common = [*ARGS, "--strategy", "full", "--world-size", "2", "--balance-field", "tokens"]
    ranks = [mount(None, *common, "--rank", str(r), src=d, name="b") for r in range(2)]
    views = [pq.read_table(m.path("c.parquet")) for m in ranks]
    got = [v.column("id").to_pylist() for v in views]
    assert sorted(got[0] + got[1]) == list(range(n)) and abs(len(got[0]) - len(got[1])) <= 1
    c0, c1 = (v.column("tokens").to_pylist() for v in views)
    assert all(a <= b for a, b in zip(c0, c1))
    assert json.loads(ranks[0].xattr("info", "c.parquet"))["balance"] == "tokens"
