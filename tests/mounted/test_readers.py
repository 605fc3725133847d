"""Level: mounted (real FUSE mounts, real readers).

Mounted: the readers people train with see each epoch's order, including readers that cache
by path, size and mtime (Hugging Face ``datasets`` with a persistent cache, for JSON Lines, CSV
and WebDataset shards), and the dataframe libraries' JSON and CSV readers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

N = 3000
DATA = b"".join(json.dumps({"id": i, "text": "x" * (i % 17)}).encode() + b"\n" for i in range(N))
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB"]

CSV = b"id,text\n" + b"".join(b'%d,"x%s"\n' % (i, b"y" * (i % 13)) for i in range(N))

LOAD = """
import json, sys
import datasets
datasets.disable_progress_bars()
builder, files, cache, column = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
ds = datasets.load_dataset(builder, data_files={"train": files}, cache_dir=cache, split="train")
print(json.dumps([str(v) for v in ds[column]]))
"""


def ids_of(data: bytes) -> list[int]:
    return [json.loads(line)["id"] for line in data.splitlines()]


def tar_shard(first: int, n: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for i in range(first, first + n):
            for suffix, data in (("json", json.dumps({"id": i}).encode()), ("cls", b"%d" % (i % 5))):
                info = tarfile.TarInfo(f"{i:05d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def tar_keys(path) -> list[str]:
    with tarfile.open(path) as t:
        return list(dict.fromkeys(m.name.split(".")[0] for m in t.getmembers()))


BUILDERS = {
    # builder: files, the column compared, that column in the order the views hold it
    "json": ({"train.jsonl": DATA}, "id", lambda m: [str(i) for i in ids_of(m.path("train.jsonl").read_bytes())]),
    "csv": ({"train.csv": CSV}, "id", lambda m: [line.split(b",")[0].decode()
                                                  for line in m.path("train.csv").read_bytes().splitlines()[1:]]),
    "webdataset": ({f"shard-{k:06d}.tar": tar_shard(k * 500, 500) for k in range(3)}, "__key__",
                   lambda m: [key for k in range(3) for key in tar_keys(m.path(f"shard-{k:06d}.tar"))]),
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_datasets_with_a_persistent_cache_sees_every_epoch(mount, tmp_path, builder):
    """Holds: SEMANTICS.md#views-mtime"""
    pytest.importorskip("datasets")
    files, column, in_view = BUILDERS[builder]
    m = mount(files, *ARGS)
    cache = tmp_path / "hf-cache"
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    paths = ",".join(str(m.path(name)) for name in sorted(files))
    seen = []
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        direct = in_view(m)
        r = subprocess.run([sys.executable, "-c", LOAD, builder, paths, str(cache), column], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        loaded = json.loads(r.stdout.strip().splitlines()[-1])
        assert loaded == direct, f"epoch {epoch}: datasets served another order (its cache?)"
        seen.append(loaded)
    assert seen[0] != seen[1] != seen[2] and len(seen[0]) == len(set(seen[0])) in (N, 1500)


def test_a_views_mtime_moves_with_the_epoch_and_agrees_across_mounts(mount):
    """Holds: SEMANTICS.md#views-mtime"""
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


def read_ids(library: str, kind: str, path: str) -> list[int]:
    """The ``id`` column as the library's JSON Lines or CSV reader returns it."""
    lib = pytest.importorskip(library)
    if library == "pandas":
        frame = lib.read_json(path, lines=True) if kind == "json" else lib.read_csv(path)
        return frame["id"].tolist()
    if library == "pyarrow":
        import pyarrow.csv as pc
        import pyarrow.json as pj

        return (pj.read_json(path) if kind == "json" else pc.read_csv(path)).column("id").to_pylist()
    return (lib.read_ndjson(path) if kind == "json" else lib.read_csv(path))["id"].to_list()


@pytest.mark.parametrize("kind", ["json", "csv"])
@pytest.mark.parametrize("library", ["pandas", "pyarrow", "polars"])
def test_dataframe_readers_read_each_epochs_order(mount, library, kind):
    pytest.importorskip(library)
    name = "train.jsonl" if kind == "json" else "train.csv"
    m = mount({name: DATA if kind == "json" else CSV}, *ARGS)
    path = str(m.path(name))
    seen = []
    for epoch in (0, 3):
        m.set_epoch(epoch)
        view = open(path, "rb").read()
        direct = ids_of(view) if kind == "json" else [int(line.split(b",")[0]) for line in view.splitlines()[1:]]
        got = read_ids(library, kind, path)
        assert got == direct and sorted(got) == list(range(N)) and got != list(range(N))
        seen.append(got)
    assert seen[0] != seen[1]
