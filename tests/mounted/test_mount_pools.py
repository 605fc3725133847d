"""Level: mounted (real FUSE mounts, real readers).

Pools of shards through real mounts: a set of shard files shuffled as one stream.

The mount keeps the shard names; output shard i holds the i-th equal share of the pool's stream,
so the shards read in name order are the pooled order (checked byte for byte against the pure
layers), together they hold every record of every shard once, and files that are no shards of a
set keep their own records.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from test_mount import ARGS, SEED, error_after_appending, jsonl, lines, read

from shufflefs.config import parse_buffer, parse_size
from shufflefs.formats import make_format
from shufflefs.windows.layout import assemble, slice_fetch
from shufflefs.index.joined_index import PooledIndex
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.slices import SlicePlan, slice_edges

BLOCK, BUFFER = "2KiB", "8KiB"
POOL_ARGS = [*ARGS, "--block-size", BLOCK, "--buffer", BUFFER]
SIZES = {"part-00000.jsonl": 300, "part-00001.jsonl": 40, "part-00002.jsonl": 220, "part-00003.jsonl": 410}


def tagged(name: str, n: int, seed: int) -> bytes:
    """JSON lines naming their source, so a record's origin shows in the view."""
    return b"".join(
        json.dumps({"src": name, **json.loads(line)}).encode() + b"\n" for line in jsonl(n, seed).splitlines()
    )


def shard_files() -> dict[str, bytes]:
    files = {name: tagged(name, n, i) for i, (name, n) in enumerate(SIZES.items())}
    files["part-00002.jsonl"] = files["part-00002.jsonl"][:-1]  # a last line without its newline
    files["train.jsonl"] = tagged("train", 120, 8)
    files["val.jsonl"] = tagged("val", 60, 9)
    return files


def sources(data: bytes) -> collections.Counter:
    return collections.Counter(json.loads(line)["src"] for line in data.splitlines())


def cat(path) -> bytes:
    r = subprocess.run(["cat", str(path)], capture_output=True)
    assert r.returncode == 0, f"cat {path}: {r.stderr.decode(errors='replace')}"
    return r.stdout


def pooled_reference(files: dict[str, bytes], names: list[str], strategy: str, epoch: int,
                     rank: int = 0, world: int = 1) -> list[bytes]:
    """What output shard i must hold, from the pure layers alone (no mount)."""
    fmt = make_format("lines")
    members = [fmt.scan(np.frombuffer(files[n], np.uint8), n) for n in names]
    base = PooledIndex(members)
    pool = base.torn_last()  # a member's last line without its newline ends the stream
    data = b"".join(files[n][m.header_end: m.trailer_start] for n, m in zip(names, members))
    b = base.bounds
    data = b"".join(data[b[f]: b[f + c]] for f, c in zip(pool.seg_base.tolist(), np.diff(pool.member_firsts).tolist()))
    spec = ShuffleSpec(strategy=strategy, seed=SEED, block_size=parse_size(BLOCK), buffer=parse_buffer(BUFFER))
    stream = make_plan(pool, spec, epoch, rank, world)
    edges = slice_edges(int(stream.window_records.sum()), len(names))
    fetch = slice_fetch(np.frombuffer(data, np.uint8))
    out = []
    for i in range(len(names)):
        s = SlicePlan(stream, int(edges[i]), int(edges[i + 1]), i, len(names))
        out.append(b"".join(assemble(pool, s.window(k), fetch).tobytes() for k in range(s.n_windows)))
    return out


@pytest.mark.parametrize("strategy", ["corgipile", "full"])
def test_shards_show_the_pooled_stream_in_name_order(mount, strategy):
    """Holds: SEMANTICS.md#ranks-pools, SEMANTICS.md#views-size"""
    files = shard_files()
    m = mount(files, *POOL_ARGS, "--strategy", strategy)
    names = sorted(SIZES)
    everything = sum((lines(files[n]) for n in names), collections.Counter())
    previous = None
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        views = [cat(m.path(n)) for n in names]
        assert views == pooled_reference(files, names, strategy, epoch)
        assert sum((lines(v) for v in views), collections.Counter()) == everything
        counts = [len(v.splitlines()) for v in views]
        assert max(counts) - min(counts) <= 1, "shards hold equal shares of the stream"
        assert [os.stat(m.path(n)).st_size for n in names] == [len(v) for v in views], "sizes refreshed per epoch"
        assert [int(m.xattr("records", n)) for n in names] == counts
        assert len(sources(views[0])) >= 3, "a shard holds records of several source shards"
        assert views != previous
        previous = views
    # files that are no shards of a set are shuffled alone
    for name in ("train.jsonl", "val.jsonl"):
        view = cat(m.path(name))
        assert lines(view) == lines(files[name])
        assert view != files[name]
    info = json.loads(m.xattr("info", "part-00001.jsonl"))
    assert (info["pool"], info["pool_shards"], info["shard"], info["shards"]) == ("part-*.jsonl", 4, 1, 4)
    assert info["stream_records"] == sum(SIZES.values())
    assert m.stats()["pooling"] is True


def test_shards_read_at_once_right_after_epoch_changes(mount):
    """Every shard read by its own thread the moment the epoch changes, while the mount prepares
    the new epoch's views itself: no reader may see an error (a shard looked up while another
    lookup sizes it, or a stream window loaded through a shard view that closes meanwhile)."""
    files = shard_files()
    m = mount(files, *POOL_ARGS, "--strategy", "corgipile")
    names = sorted(SIZES)
    everything = sum((lines(files[n]) for n in names), collections.Counter())
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        for epoch in range(30):
            m.set_epoch(epoch)
            views = list(pool.map(lambda n: cat(m.path(n)), names))
            assert sum((lines(v) for v in views), collections.Counter()) == everything, f"epoch {epoch}"


def test_no_pool_shuffles_each_shard_alone(mount):
    """Holds: SEMANTICS.md#ranks-pools"""
    files = shard_files()
    m = mount(files, *POOL_ARGS, "--no-pool")
    for name in SIZES:
        view = read(m.path(name))
        assert lines(view) == lines(files[name]), f"{name} holds only its own records"
    assert "pool" not in json.loads(m.xattr("info", "part-00000.jsonl"))
    assert m.stats()["pooling"] is False


def test_a_declared_glob_pools_files_across_directories(mount, tmp_path):
    files = {"a/x.jsonl": tagged("x", 200, 1), "b/y.jsonl": tagged("y", 200, 2), "b/z.txt": b"alone\n" * 50}
    config = tmp_path / "pools.toml"
    config.write_text('[[pool]]\nglob = "*/*.jsonl"\n')
    m = mount(files, *POOL_ARGS, "--config", str(config))
    views = [cat(m.path(n)) for n in ("a/x.jsonl", "b/y.jsonl")]
    assert sum((lines(v) for v in views), collections.Counter()) == lines(files["a/x.jsonl"]) + lines(files["b/y.jsonl"])
    assert all(len(sources(v)) == 2 for v in views), "each output file mixes both sources"
    assert lines(cat(m.path("b/z.txt"))) == lines(files["b/z.txt"])
    assert json.loads(m.xattr("info", "b/y.jsonl"))["pool_declared"] is True


def test_ranks_of_a_pool_hold_every_record_once(mount):
    files = shard_files()
    world = 2
    first = mount(files, *POOL_ARGS, "--rank", "0", "--world-size", str(world))
    ranks = [first, mount(None, *POOL_ARGS, "--rank", "1", "--world-size", str(world), src=first.src)]
    names = sorted(SIZES)
    for epoch in (0, 3):
        for m in ranks:
            m.set_epoch(epoch)
        got = collections.Counter()
        for r, m in enumerate(ranks):
            views = [cat(m.path(n)) for n in names]
            assert views == pooled_reference(files, names, "stratified", epoch, r, world)
            got += sum((lines(v) for v in views), collections.Counter())
        assert got == sum((lines(files[n]) for n in names), collections.Counter())


def test_npy_shards_pool_rows_with_rewritten_headers(mount):
    arrays = {f"data_{i}.npy": np.arange(i * 1000, i * 1000 + n * 3, dtype="<i4").reshape(n, 3)
              for i, n in enumerate((500, 130, 260))}
    files = {}
    for name, a in arrays.items():
        buf = io.BytesIO()
        np.save(buf, a)
        files[name] = buf.getvalue()
    m = mount(files, *POOL_ARGS, "--block-size", "1KiB", "--buffer", "4KiB")
    loaded = [np.load(m.path(n)) for n in sorted(arrays)]
    assert [len(x) for x in loaded] == [297, 297, 296]
    rows = np.concatenate(loaded)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, np.concatenate(list(arrays.values())).tolist()))
    assert len({int(r[0]) // 1000 for r in loaded[1]}) >= 2, "an output array holds rows of several sources"
    mapped = np.load(m.path("data_1.npy"), mmap_mode="r")
    assert np.array_equal(mapped, loaded[1])


def test_npy_shards_with_different_rows_are_refused(mount):
    """Holds: SEMANTICS.md#errors-eio"""
    files = {}
    for name, a in {"d_0.npy": np.zeros((10, 3), "<i4"), "d_1.npy": np.zeros((10, 4), "<i4")}.items():
        buf = io.BytesIO()
        np.save(buf, a)
        files[name] = buf.getvalue()
    m = mount(files, *POOL_ARGS)
    with pytest.raises(OSError) as e:
        read(m.path("d_0.npy"))
    assert e.value.errno == errno.EIO
    assert any("d_1.npy" in line and "--no-pool" in line for line in m.stats()["last_errors"])


def test_a_shard_changed_while_mounted_is_an_error_not_wrong_bytes(mount):
    """Holds: SEMANTICS.md#changes-pool, SEMANTICS.md#errors-estale"""
    files = shard_files()
    m = mount(files, *POOL_ARGS)
    e = error_after_appending(m.path("part-00000.jsonl"), m.src / "part-00003.jsonl", b'{"src": "late"}\n')
    assert e.errno == errno.ESTALE
    assert any("part-00003.jsonl" in line for line in m.stats()["last_errors"])


def test_the_epoch_of_one_shard_is_the_epoch_of_its_pool(mount):
    """Holds: SEMANTICS.md#epochs-file"""
    files = shard_files()
    m = mount(files, *POOL_ARGS)
    names = sorted(SIZES)
    m.set_epoch(5, "part-00002.jsonl")
    assert [m.xattr("epoch", n) for n in names] == ["5"] * 4
    views = [cat(m.path(n)) for n in names]
    assert views == pooled_reference(files, names, "stratified", 5)
    assert m.xattr("epoch", "train.jsonl") == "0"


def shufflefs(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          cwd=str(REPO), timeout=60)


def test_stat_shows_pooling_and_inspect_refuses_a_shard(mount):
    m = mount(shard_files(), *POOL_ARGS, "--pool", "*.jsonl")
    out = shufflefs("stat", m.mnt)
    assert out.returncode == 0 and "shard sets by name, declared: *.jsonl" in out.stdout
    got = shufflefs("inspect", m.path("part-00000.jsonl"))
    assert got.returncode != 0 and "of the pool '*.jsonl'" in got.stderr
    # the declared glob pools every .jsonl file, train and val too
    names = sorted(shard_files())
    views = [cat(m.path(n)) for n in names]
    assert sum((lines(v) for v in views), collections.Counter()) == sum(
        (lines(f) for f in shard_files().values()), collections.Counter())
    assert "val" in sources(views[names.index("train.jsonl")])


def test_no_pool_and_pool_together_are_a_usage_error(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "mnt").mkdir()
    got = shufflefs("mount", tmp_path / "src", tmp_path / "mnt", "--no-pool", "--pool", "*.jsonl",
                    "--cache-dir", tmp_path / "cache")
    assert got.returncode == 2 and "--no-pool" in got.stderr


def test_tfrecord_shards_pool_and_read_with_a_tfrecord_reader(mount, tmp_path):
    from tfrecord.reader import tfrecord_loader
    from test_mount import tf_frames, tfrecords

    names = [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    src = tmp_path / "tf"
    src.mkdir()
    payloads = {}
    for i, n in enumerate(names):
        payloads[n] = [f"{i}:{j}:".encode() + b"p" * (j % 37) for j in range((120, 45, 300)[i])]
        tfrecords(payloads[n], src / n)
    m = mount(None, *POOL_ARGS, src=src)
    got = []
    mixed = 0
    for n in names:
        frames = tf_frames(read(m.path(n)))  # every CRC checks out
        records = [bytes(r["p"]) for r in tfrecord_loader(str(m.path(n)), None, {"p": "byte"})]
        assert len(frames) == len(records)
        mixed += len({r.split(b":")[0] for r in records}) >= 2
        got += records
    # the shards are stretches of one pooled stream (a stretch of 155 of the 465 records may fall
    # where the order drew blocks of the largest source only)
    assert mixed >= 2, "shards hold records of several sources"
    assert collections.Counter(got) == collections.Counter(p for n in names for p in payloads[n])
