"""Level: mounted (real FUSE mounts, real readers).

Mixtures of every kind of file: ``.npy`` arrays (``numpy.load``, mapped too, a header for the
shard's rows; Fortran-order sources), WebDataset tar shards (``webdataset`` reads whole samples
of each source in proportion), TFRecord (the ``tfrecord`` reader, checksums intact).  Each
shard is a valid file of its format, and the blend holds each source's quota.
"""

from __future__ import annotations

import collections
import io
import json
import os
import tarfile

import numpy as np
import pytest
from test_mix import config
from test_mount import tf_frames, tfrecords

ARGS = ["--seed", "3", "--block-size", "1KiB", "--buffer", "16KiB"]


def _shards(mnt, name: str = "blend") -> list:
    d = mnt / ".mix" / name
    return [d / n for n in sorted(os.listdir(d))]


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_arrays_mix_rows_and_every_shard_loads(mount, tmp_path, order):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    for name, first, n in (("a/x.npy", 0, 300), ("a/y.npy", 300, 200), ("b/z.npy", 10_000, 90)):
        rows = np.arange(first, first + n, dtype=np.float32)[:, None] * np.ones((1, 6), np.float32)
        np.save(src / name, np.asarray(rows, order=order))
    cfg = config(tmp_path, 400, [("a/*.npy", 3), ("b/*.npy", 1)], extra="shards = 3\n")
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    arrays = [np.load(p) for p in _shards(m.mnt)]
    mapped = [np.load(p, mmap_mode="r") for p in _shards(m.mnt)]
    for a, b in zip(arrays, mapped):
        assert a.shape[1:] == (6,) and a.dtype == np.float32 and np.array_equal(a, b)
        assert np.all(a == a[:, :1])  # rows whole: every column of a row from one source row
    rows = np.concatenate(arrays)[:, 0]
    assert len(rows) == 400
    assert np.count_nonzero(rows < 10_000) == 300 and len(np.unique(rows[rows < 10_000])) == 300
    b = rows[rows >= 10_000]
    assert len(b) == 100 and set(collections.Counter(b).values()) == {1, 2}  # 90 records once, 10 again


def _tar(prefix: str, first: int, n: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for j in range(first, first + n):
            for suffix, data in (("json", json.dumps({"src": prefix, "j": j}).encode()), ("txt", prefix.encode())):
                info = tarfile.TarInfo(f"{prefix}/{j:06d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_webdataset_shards_mix_whole_samples(mount, tmp_path):
    wds = pytest.importorskip("webdataset")
    src = tmp_path / "src"
    (src / "web").mkdir(parents=True)
    (src / "img").mkdir()
    for i in range(3):
        (src / "web" / f"web-{i:06d}.tar").write_bytes(_tar("web", 100 * i, 100))
    (src / "img" / "img-000000.tar").write_bytes(_tar("img", 0, 60))
    cfg = config(tmp_path, 240, [("web/*.tar", 1), ("img/*.tar", 1)])
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    urls = [str(p) for p in _shards(m.mnt)]
    assert all(u.endswith(".tar") for u in urls) and len(urls) == 4
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode())
    assert len(samples) == 240
    assert collections.Counter(s["txt"] for s in samples) == {"web": 120, "img": 120}
    assert all(s["json"]["src"] == s["txt"] for s in samples)  # members of a sample stay together
    web = [s["json"]["j"] for s in samples if s["txt"] == "web"]
    assert len(set(web)) == 120  # down-sampled: no repeats
    img = collections.Counter(s["json"]["j"] for s in samples if s["txt"] == "img")
    assert len(img) == 60 and set(img.values()) == {2}  # up-sampled: two whole passes


def test_tfrecord_shards_keep_their_frames(mount, tmp_path):
    pytest.importorskip("tfrecord")
    from tfrecord.reader import tfrecord_loader

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    tfrecords([b"a%05d" % i for i in range(500)], src / "a" / "a.tfrecord")
    tfrecords([b"b%05d" % i for i in range(100)], src / "b" / "b.tfrecord")
    cfg = config(tmp_path, 300, [("a/*.tfrecord", 2), ("b/*.tfrecord", 1)], extra="shards = 2\n")
    m = mount(None, *ARGS, "--config", str(cfg), src=src)
    got = []
    for p in _shards(m.mnt):
        assert len(tf_frames(p.read_bytes())) > 0  # every frame's checksums hold
        got.extend(bytes(r["p"]) for r in tfrecord_loader(str(p), None, {"p": "byte"}))
    assert len(got) == 300
    assert collections.Counter(g[:1] for g in got) == {b"a": 200, b"b": 100}
    assert len(set(got)) == 300
