"""Level: mounted (real FUSE mounts, real readers).

WebDataset shards through a mount: `tarfile`, GNU ``tar -tvf`` and ``webdataset.WebDataset``
(decoding ``.json``, ``.cls`` and a PNG with PIL) read every view as the same samples with
identical bytes, pooled shards hold every sample exactly once per epoch in a new order, loader
parts and a torch DataLoader with two workers split them without overlap, and a damaged shard is
EIO with a log line naming the file and the offset."""

from __future__ import annotations

import collections
import errno
import io
import json
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

from shufflefs.formats.tar import TarFormat
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.windows.layout import render

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

SHARDS, PER_SHARD = 4, 60
ARGS = ["--block-size", "16KiB", "--buffer", "64KiB", "--seed", "11"]


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (4, 3), color=value).save(out, format="PNG")
    return out.getvalue()


def shard(i: int, n: int = PER_SHARD, classes: int = 1) -> bytes:
    """Samples of class i (or classes i.. in blocks of n // classes: a dataset sorted by label),
    keys unique across shards."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for j in range(n):
            key, label = f"s{i}/{i * 1000 + j:06d}", i + j * classes // n
            for suffix, data in (("png", png(j % 256)), ("json", json.dumps({"i": i, "j": j}).encode()),
                                 ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def files() -> dict[str, bytes]:
    return {f"shard-{i:06d}.tar": shard(i) for i in range(SHARDS)}


def members(data: bytes) -> collections.Counter:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return collections.Counter((m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isreg())


def wds_samples(urls: list[str]) -> list[dict]:
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")
    return list(ds)


def test_a_single_shard_reads_in_every_reader(mount) -> None:
    """Holds: SEMANTICS.md#views-records"""
    data = shard(7, 80)
    m = mount({"one.tar": data}, *ARGS, "--no-pool")
    view = m.path("one.tar").read_bytes()
    assert len(view) == len(data) and view != data
    index = TarFormat().scan(np.frombuffer(data, np.uint8), "one.tar")
    assert view == render(index, make_plan(index, ShuffleSpec(strategy="stratified", seed=11, block_size=16384,
                                                               buffer=65536), 0), data)
    assert members(view) == members(data)
    if shutil.which("tar"):
        listing = subprocess.run(["tar", "-tvf", str(m.path("one.tar"))], capture_output=True, text=True, check=True)
        assert len(listing.stdout.splitlines()) == 80 * 3
    got = wds_samples([str(m.path("one.tar"))])
    assert len(got) == 80
    for s in got:
        i, j = s["json"]["i"], s["json"]["j"]
        assert s["cls"] == 7 == i and s["__key__"] == f"s7/{7000 + j:06d}"
        assert s["png"].size == (4, 3) and s["png"].getpixel((0, 0)) == (j % 256,) * 3  # decoded as RGB
    assert [s["__key__"] for s in got] != sorted(s["__key__"] for s in got)


def test_pooled_shards_hold_every_sample_once_per_epoch(mount) -> None:
    m = mount(files(), *ARGS)
    urls = [str(m.path(f"shard-{i:06d}.tar")) for i in range(SHARDS)]
    seen = []
    for epoch in range(2):
        m.set_epoch(epoch)
        got = wds_samples(urls)
        keys = [s["__key__"] for s in got]
        assert len(keys) == len(set(keys)) == SHARDS * PER_SHARD
        seen.append(keys)
        first = [s["cls"] for s in got[:PER_SHARD]]
        assert len(set(first)) > 1  # shard 0 of the view mixes classes: the pool is shuffled
    assert seen[0] != seen[1]
    info = json.loads(m.xattr("info", "shard-000000.tar"))
    assert info["pool_shards"] == SHARDS


def test_parts_and_a_dataloader_with_two_workers_split_without_overlap(mount) -> None:
    torch = pytest.importorskip("torch")
    m = mount(files(), *ARGS)
    parts = []
    for i in range(2):
        urls = [str(m.path(f".parts/2/{i}/shard-{k:06d}.tar")) for k in range(SHARDS)]
        parts.append([s["__key__"] for s in wds_samples(urls)])
    assert not set(parts[0]) & set(parts[1])
    assert len(parts[0]) + len(parts[1]) == SHARDS * PER_SHARD
    urls = [str(m.path(f"shard-{k:06d}.tar")) for k in range(SHARDS)]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False,
                        workersplitter=wds.split_by_worker).to_tuple("__key__", "cls")
    loader = torch.utils.data.DataLoader(ds, num_workers=2, batch_size=None)
    keys = [k for k, _ in loader]
    assert len(keys) == len(set(keys)) == SHARDS * PER_SHARD


def test_ranks_read_disjoint_samples_that_cover_every_shard(mount) -> None:
    ranks = [mount(files(), *ARGS, "--rank", "0", "--world-size", "2", name="r")]
    ranks.append(mount(None, *ARGS, "--rank", "1", "--world-size", "2", src=ranks[0].src, name="r"))
    for epoch in (0, 5):
        got = []
        for m in ranks:
            m.set_epoch(epoch)
            got.append([s["__key__"] for s in wds_samples([str(m.path(f"shard-{k:06d}.tar")) for k in range(SHARDS)])])
        assert not set(got[0]) & set(got[1])
        assert sorted(got[0] + got[1]) == sorted(f"s{i}/{i * 1000 + j:06d}" for i in range(SHARDS) for j in range(PER_SHARD))
        assert abs(len(got[0]) - len(got[1])) <= 1


def test_a_damaged_shard_is_eio_naming_file_and_offset(mount) -> None:
    """Holds: SEMANTICS.md#errors-eio"""
    good = shard(1, 10)
    bad = bytearray(good)
    second = len(good) // 2 // 512 * 512
    with tarfile.open(fileobj=io.BytesIO(good)) as t:
        second = [m.offset for m in t.getmembers()][5]
    bad[second + 3] ^= 0x55  # a header byte: its checksum fails
    m = mount({"bad.tar": bytes(bad), "good.tar": good}, *ARGS, "--no-pool")
    with pytest.raises(OSError) as e:
        m.path("bad.tar").read_bytes()
    assert e.value.errno == errno.EIO
    errors = " ".join(map(str, m.stats()["last_errors"]))
    assert "bad.tar" in errors and f"offset {second}" in errors and "checksum" in errors
    assert members(m.path("good.tar").read_bytes()) == members(good)


def test_inspect_shows_the_label_mix_of_sorted_shards(mount) -> None:
    import sys

    from conftest import REPO

    m = mount({"sorted.tar": shard(0, 200, classes=4)}, *ARGS, "--no-pool")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "shufflefs", "inspect", str(m.path("sorted.tar")),
                          "--label-field", "cls", "--json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["records"] == 200 and report["labels"] == ["0", "1", "2", "3"] and report["label"] == "field cls"
    tv = {name: m["label_tv"] for name, m in report["strategies"].items()}
    assert tv["stratified"] < 0.3  # the view's (the default); the source order: 0.5 (every 100 records hold two labels at most)
