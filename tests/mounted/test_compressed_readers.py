"""Level: mounted (real FUSE mounts, real readers).

Compressed text views through a mount with default options: ``.jsonl.gz`` (one gzip member, and
many), ``.csv.gz``, ``.json.zst`` in frames, ``.jsonl.zst`` and ``.csv.zst`` in one frame (decoded
into a copy), each of a few MB of label-sorted records.  Every reader that decompresses by the
file's name reads the view at the same path unchanged: ``gzip.open`` and ``zstandard`` line loops,
pandas ``read_json(lines=True)`` and ``read_csv``, polars ``read_ndjson`` and ``read_csv``, and
Hugging Face ``datasets.load_dataset`` (json, csv).  Each gets its source's records, each once, in
an order that mixes the labels as a uniform shuffle does (per 100 records, as ``shufflefs
inspect`` measures it) and changes with the epoch."""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

import compressed_files as cf

pd = pytest.importorskip("pandas")
pl = pytest.importorskip("polars")

MIX_SLACK = 1.3
"""A view's label mix per 100 records may exceed a uniform shuffle's expectation by this factor
(a source in label order scores 0.9, a uniform shuffle about 0.12)."""


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, bytes]:
    """The source files by name, and their decoded bytes under ``plain:NAME``."""
    lines, rows = cf.jsonl(), cf.csv_text()
    files = {
        "train.jsonl.gz": cf.gz(lines),
        "members.jsonl.gz": cf.gz(lines, members=5),
        "rows.csv.gz": cf.gz(rows),
        "frames.json.zst": cf.zst(lines, frame=1 << 20),
        "one.jsonl.zst": cf.zst(lines),
        "one.csv.zst": cf.zst(rows),
    }
    return files | {f"plain:{name}": lines if "json" in name else rows for name in files}


@pytest.fixture(scope="module")
def mnt(module_mount, tree):
    return module_mount({k: v for k, v in tree.items() if not k.startswith("plain:")}, "--seed", "5")


JSONL = ["train.jsonl.gz", "members.jsonl.gz", "frames.json.zst", "one.jsonl.zst"]
CSV = ["rows.csv.gz", "one.csv.zst"]


def line_loop(path: Path) -> list[bytes]:
    """The line loop users run over a compressed file, by its suffix."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return [line for line in f]
    with open(path, "rb") as raw:
        return [line for line in io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))]


@pytest.mark.parametrize("name", JSONL)
def test_line_loops_read_every_record_once_well_mixed_new_each_epoch(mnt, tree, name: str):
    """Holds: SEMANTICS.md#views-compressed, SEMANTICS.md#views-records"""
    want = collections.Counter(cf.lines_of(tree[f"plain:{name}"]))
    got0 = line_loop(mnt.path(name))
    assert collections.Counter(got0) == want
    mix, uniform = cf.label_mix(cf.labels_of(got0))
    assert mix < MIX_SLACK * uniform, (mix, uniform)
    mnt.set_epoch(1, name)
    got1 = line_loop(mnt.path(name))
    assert collections.Counter(got1) == want and got1 != got0
    mnt.set_epoch(0, name)


@pytest.mark.parametrize("name", JSONL + CSV)
def test_size_is_the_bytes_read_and_any_offset_reads_alike(mnt, name: str):
    """Holds: SEMANTICS.md#views-compressed-size, SEMANTICS.md#reads-pread"""
    path = mnt.path(name)
    whole = path.read_bytes()
    assert os.stat(path).st_size == len(whole)
    plain = cf.decode(name, whole)
    container = {".gz": (23, 65535, 0), ".zst": (3, 128 << 10, 14)}[path.suffix]
    per, unit, head = container
    assert len(whole) == head + len(plain) + per * -(-len(plain) // unit)  # stored/raw blocks
    rng = np.random.default_rng(1)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(40):
            off = int(rng.integers(0, len(whole)))
            n = int(rng.choice([1, 100, 70_000, 1 << 20]))
            assert os.pread(fd, n, off) == whole[off: off + n]
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", JSONL)
def test_pandas_and_polars_read_json_lines_by_the_name(mnt, tree, name: str):
    """Holds: SEMANTICS.md#views-compressed"""
    want = sorted(json.loads(line)["id"] for line in cf.lines_of(tree[f"plain:{name}"]))
    df = pd.read_json(mnt.path(name), lines=True)
    assert sorted(df["id"].tolist()) == want and df["id"].tolist() != want
    mix, uniform = cf.label_mix(df["label"].to_numpy())
    assert mix < MIX_SLACK * uniform, (mix, uniform)
    pf = pl.read_ndjson(mnt.path(name))
    assert pf["id"].to_list() == df["id"].tolist()


@pytest.mark.parametrize("name", CSV)
def test_pandas_and_polars_read_csv_by_the_name(mnt, tree, name: str):
    """Holds: SEMANTICS.md#views-compressed"""
    src = pd.read_csv(io.BytesIO(tree[f"plain:{name}"]))
    df = pd.read_csv(mnt.path(name))
    assert list(df.columns) == ["id", "label", "text"]
    assert df.sort_values("id").reset_index(drop=True).equals(src)
    assert df["id"].tolist() != src["id"].tolist()
    mix, uniform = cf.label_mix(df["label"].to_numpy())
    assert mix < MIX_SLACK * uniform, (mix, uniform)
    pf = pl.read_csv(mnt.path(name))
    assert pf["id"].to_list() == df["id"].tolist() and pf["text"].to_list() == df["text"].tolist()


def test_hugging_face_datasets_loads_json_and_csv_views(mnt, tree, tmp_path):
    """Holds: SEMANTICS.md#views-compressed"""
    code = (
        "import sys, json, datasets\n"
        "datasets.disable_progress_bars()\n"
        "out = {}\n"
        "for kind, name in (('json', 'train.jsonl.gz'), ('json', 'frames.json.zst'), ('csv', 'rows.csv.gz'),"
        " ('csv', 'one.csv.zst')):\n"
        "    d = datasets.load_dataset(kind, data_files=sys.argv[1] + '/' + name, split='train', cache_dir=sys.argv[2])\n"
        "    out[name] = list(d['id'])\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code, str(mnt.path()), str(tmp_path / "hf")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) == 4
    for name, ids in got.items():
        plain = io.BytesIO(tree[f"plain:{name}"])
        n = len(pd.read_csv(plain)) if "csv" in name else len(cf.lines_of(plain.getvalue()))
        assert sorted(ids) == list(range(n)) and ids != sorted(ids), name


def test_a_single_frame_is_read_from_a_decoded_copy_and_stat_says_so(mnt):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    info = json.loads(mnt.xattr("info", "one.jsonl.zst"))["compressed"]
    assert info["read_from"] == "a decoded copy" and info["restart_points"] == 1
    assert "one zstd frame" in info["copied_because"]
    framed = json.loads(mnt.xattr("info", "frames.json.zst"))["compressed"]
    assert framed["restart_points"] >= 6  # read from them, or from a copy made in the background once read
    assert framed["read_from"] == "restart points" or "auto" in framed["copied_because"]
    gz = json.loads(mnt.xattr("info", "train.jsonl.gz"))
    assert gz["compressed"]["codec"] == "gzip"
    assert gz["compressed"]["read_from"] == "restart points" or "auto" in gz["compressed"]["copied_because"]
    line_loop(mnt.path("one.jsonl.zst"))
    stats = mnt.stats()
    assert stats["decoded"]["files"] >= 1 and any(p.endswith("one.jsonl.zst") for p in stats["decoded_copies"])
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(mnt.path())], capture_output=True,
                         text=True, timeout=60).stdout
    assert "decoded copy" in out and "one.jsonl.zst" in out
    copies = Path(stats["decoded"]["dir"])
    assert copies.is_dir() and any(copies.iterdir())


def test_empty_compressed_files_are_empty_views(mount):
    """A gzip or zstd stream of no bytes (an empty shard a pipeline wrote) is an empty view that
    every reader reads as the source: no record, no error.
    Holds: SEMANTICS.md#views-compressed"""
    files = {"e.jsonl.gz": gzip.compress(b""), "e.jsonl.zst": zstandard.ZstdCompressor().compress(b""),
             "e.csv.gz": gzip.compress(b""), "a.jsonl.gz": cf.gz(cf.jsonl())}
    m = mount(files)
    for name in ("e.jsonl.gz", "e.csv.gz"):
        with gzip.open(m.path(name)) as f:
            assert f.read() == b""
    with open(m.path("e.jsonl.zst"), "rb") as f:
        assert zstandard.ZstdDecompressor().stream_reader(f).read() == b""
    assert line_loop(m.path("a.jsonl.gz"))  # its neighbour is served as ever
    assert m.stats()["errors"] == 0


@pytest.mark.parametrize("args", [(), ("--decoded-copies", "needed")])
def test_a_gzip_file_padded_with_zeros_is_served_as_gzip_reads_it(mount, args):
    """Zero bytes after the last member (tools that fill a block write them; gzip and Python's
    gzip skip them) are not records: the view holds the members' lines, read from a copy (auto) or
    decoded from restart points (needed).  Holds: SEMANTICS.md#views-compressed"""
    lines = cf.jsonl(3000)
    files = {"padded.jsonl.gz": cf.gz(lines, members=3) + bytes(65536),
             "empty-last.jsonl.gz": cf.gz(lines) + gzip.compress(b"") + bytes(512)}
    m = mount(files, *args)
    for name, raw in files.items():
        want = collections.Counter(cf.lines_of(gzip.decompress(raw)))
        got = line_loop(m.path(name))
        assert collections.Counter(got) == want
        mix, uniform = cf.label_mix(cf.labels_of(got))
        assert mix < MIX_SLACK * uniform, (mix, uniform)
        df = pd.read_json(m.path(name), lines=True)
        assert sorted(df["id"].tolist()) == sorted(json.loads(line)["id"] for line in want.elements())
    assert m.stats()["errors"] == 0
