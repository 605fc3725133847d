"""Level: mounted (real FUSE mounts, real readers).

Mounted: the readers people train with see each epoch's order, including readers that cache
by path, size and mtime (Hugging Face ``datasets`` with a persistent cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

N = 3000
DATA = b"".join(json.dumps({"id": i, "text": "x" * (i % 17)}).encode() + b"\n" for i in range(N))
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB"]

LOAD = """
import json, sys
import datasets
datasets.disable_progress_bars()
ds = datasets.load_dataset("json", data_files=sys.argv[1], cache_dir=sys.argv[2], split="train")
print(json.dumps(list(ds["id"])))
"""


def ids_of(data: bytes) -> list[int]:
    return [json.loads(line)["id"] for line in data.splitlines()]


def test_datasets_with_a_persistent_cache_sees_every_epoch(mount, tmp_path):
    pytest.importorskip("datasets")
    m = mount({"train.jsonl": DATA}, *ARGS)
    cache = tmp_path / "hf-cache"
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    seen = []
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        direct = ids_of(open(m.path("train.jsonl"), "rb").read())
        r = subprocess.run([sys.executable, "-c", LOAD, str(m.path("train.jsonl")), str(cache)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        loaded = json.loads(r.stdout.strip().splitlines()[-1])
        assert loaded == direct, f"epoch {epoch}: datasets served another order (its cache?)"
        seen.append(loaded)
    assert seen[0] != seen[1] != seen[2] and sorted(seen[0]) == list(range(N))


def test_a_views_mtime_moves_with_the_epoch_and_agrees_across_mounts(mount):
    a = mount({"train.jsonl": DATA}, *ARGS, name="a")
    b = mount(None, *ARGS, src=a.src, name="b")
    src_mtime = os.stat(a.src / "train.jsonl").st_mtime_ns
    times = []
    for epoch in (0, 1, 7):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        ta, tb = os.stat(a.path("train.jsonl")).st_mtime_ns, os.stat(b.path("train.jsonl")).st_mtime_ns
        assert ta == tb
        times.append(ta)
    assert times[0] == src_mtime and len(set(times)) == 3


@pytest.mark.parametrize("library", ["pandas", "pyarrow", "polars"])
def test_dataframe_json_readers_read_the_views_order(mount, library):
    lib = pytest.importorskip(library)
    m = mount({"train.jsonl": DATA}, *ARGS)
    m.set_epoch(3)
    path = str(m.path("train.jsonl"))
    direct = ids_of(open(path, "rb").read())
    if library == "pandas":
        got = lib.read_json(path, lines=True)["id"].tolist()
    elif library == "pyarrow":
        import pyarrow.json as pj

        got = pj.read_json(path).column("id").to_pylist()
    else:
        got = lib.read_ndjson(path)["id"].to_list()
    assert got == direct and sorted(got) == list(range(N)) and got != list(range(N))
