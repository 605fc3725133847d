"""Level: mounted (real FUSE mounts, real readers).

Shared mappings of views: every format's view, a pool's shard, a rank's share and a loader part,
under every strategy and two epochs, map to the bytes ``read()`` gives; ``pandas.read_csv`` (which
maps files of 5 MB and more) and ``numpy.memmap`` read views by path; a new epoch never shows an
old epoch's cached pages; and ``--direct-io`` gives up shared mappings (ENODEV)."""

from __future__ import annotations

import errno
import io
import json
import mmap
import os
import struct
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import Mount
from shufflefs.config import parse_buffer, parse_size
from shufflefs.formats import parse_format_option, resolve_format, scan_file
from shufflefs.windows.layout import render
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan

BLOCK, BUFFER, SEED, RECORD = "4KiB", "16KiB", 5, 24
ARGS = ["--block-size", BLOCK, "--buffer", BUFFER, "--seed", str(SEED),
        "--format", f"*.bin=fixed:record_size={RECORD}"]
RULES = [parse_format_option(f"*.bin=fixed:record_size={RECORD}")]
EPOCHS = (1, 2)


def jsonl(n: int, first: int = 0) -> bytes:
    return b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * (i % 29)) for i in range(first, first + n))


def tfrecord(payloads: list[bytes]) -> bytes:
    import crc32c

    def masked(data: bytes) -> bytes:
        c = crc32c.crc32c(data)
        return struct.pack("<I", (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    out = []
    for p in payloads:
        n = struct.pack("<Q", len(p))
        out += [n, masked(n), p, masked(p)]
    return b"".join(out)


def tar_shard(n: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for i in range(n):
            for suffix, data in (("json", json.dumps({"id": i}).encode()), ("cls", b"%d" % (i % 5))):
                info = tarfile.TarInfo(f"{i:05d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def big_frame(rows: int = 110_000) -> pd.DataFrame:
    """Text fields with commas, quotes and newlines, so that pandas quotes them."""
    rng = np.random.default_rng(11)
    words = np.array(["alpha", "be,ta", 'say "hi"', "multi\nline", "x" * 40, "tail, end\n"])
    picks = rng.integers(0, len(words), size=(rows, 4))
    text = ["|".join(words[p]) + f" #{i}" for i, p in enumerate(picks)]
    return pd.DataFrame({"id": np.arange(rows), "text": text, "v": rng.random(rows).round(6)})


FRAME = big_frame()
BIG_CSV = FRAME.to_csv(index=False).encode()
assert len(BIG_CSV) >= 8 << 20
FILES = {
    "a.jsonl": jsonl(2000),
    "t.csv": b"id,name\n" + b"".join(b'%d,"n, %d ""q"""\n' % (i, i) for i in range(1500)),
    "notes.txt": b"".join(b"line %d of text\n" % i for i in range(2500)),
    "arr.npy": npy(np.arange(6000, dtype="<i8").reshape(2000, 3)),
    "fixed.bin": b"".join(struct.pack("<QQQ", i, i * i, 7) for i in range(3000)),
    "recs.tfrecord": tfrecord([b"r%d" % i * (1 + i % 9) for i in range(1500)]),
    "shard.tar": tar_shard(300),
    "set/part-00000.jsonl": jsonl(1200),
    "set/part-00001.jsonl": jsonl(1500, 1200),
    "big.csv": BIG_CSV,
}
VIEWS = [rel for rel in FILES if rel != "big.csv"] + [".parts/2/1/a.jsonl", ".parts/3/0/notes.txt"]


def shared_map(path: Path) -> bytes:
    """The bytes of a shared, read-only mapping of ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
            return mm[:]
    finally:
        os.close(fd)


def read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return b"".join(iter(lambda: f.read(1 << 16), b""))


def check_csv(path: Path) -> None:
    got = pd.read_csv(path).sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, FRAME)


@pytest.fixture(scope="module")
def big_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import write_tree
    return write_tree(tmp_path_factory.mktemp("mmap") / "src", FILES)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_shared_mappings_equal_reads(mount, big_src: Path, strategy: str):
    """Holds: SEMANTICS.md#views-pagecache"""
    m = mount(None, *ARGS, "--strategy", strategy, src=big_src)
    share = mount(None, *ARGS, "--strategy", strategy, "--rank", "1", "--world-size", "2", src=big_src, name="r1")
    for epoch in EPOCHS:
        m.set_epoch(epoch)
        share.set_epoch(epoch)
        seen = {}
        for where, rel in [(m, r) for r in VIEWS] + [(share, "a.jsonl"), (share, "set/part-00001.jsonl")]:
            want = read(where.path(rel))
            assert want, rel
            assert shared_map(where.path(rel)) == want, (strategy, epoch, rel)
            seen[where.path(rel)] = want
        check_csv(m.path("big.csv"))
        mem = np.memmap(m.path("a.jsonl"), dtype=np.uint8, mode="r")
        assert mem.tobytes() == seen[m.path("a.jsonl")]
        del mem
        if strategy != "none":
            assert seen[m.path("a.jsonl")] != FILES["a.jsonl"]
            assert sorted(seen[m.path("a.jsonl")].splitlines()) == sorted(FILES["a.jsonl"].splitlines())


def test_pandas_read_csv_fails_with_direct_io(mount, big_src: Path):
    """Holds: SEMANTICS.md#errors-enodev

    What ``--direct-io`` breaks: pandas maps a CSV of 5 MB or more with a shared mapping when it
    reads it in parallel, as pandas 3.1 does with plain rows (a file with quoted newlines it may
    read serially, unmapped, depending on where its rows fall: the big CSV's default view
    does)."""
    plain = pd.DataFrame({"id": np.arange(400_000), "v": np.random.default_rng(3).random(400_000)})  # 10 MB
    m = mount({"plain.csv": plain.to_csv(index=False).encode()}, *ARGS, "--direct-io", name="plain")
    with pytest.raises(OSError) as e:
        pd.read_csv(m.path("plain.csv"))
    assert e.value.errno == errno.ENODEV
    m = mount(None, *ARGS, "--direct-io", src=big_src)
    with pytest.raises(OSError) as e:
        shared_map(m.path("a.jsonl"))
    assert e.value.errno == errno.ENODEV
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, mmap.MAP_PRIVATE, mmap.PROT_READ) as mm:
            assert mm[:] == read(m.path("a.jsonl"))
    finally:
        os.close(fd)
    assert shared_map(m.path("arr.npy")) == read(m.path("arr.npy"))
    assert shared_map(m.path("fixed.bin")) == read(m.path("fixed.bin"))


def reference(src: Path, rel: str, epoch: int) -> bytes:
    """The bytes the default (stratified) view of ``rel`` must have in ``epoch``."""
    spec = ShuffleSpec(strategy="stratified", seed=SEED, block_size=parse_size(BLOCK), buffer=parse_buffer(BUFFER))
    index = scan_file(src / rel, resolve_format(rel, RULES, {}))
    return render(index, make_plan(index, spec, epoch, 0, 1), (src / rel).read_bytes())


@pytest.mark.parametrize("rel", ["a.jsonl", "fixed.bin"])
def test_a_new_epoch_never_shows_cached_pages_of_the_last(mount, rel: str):
    """Holds: SEMANTICS.md#views-pagecache

    Every epoch's view is its own inode, so pages the kernel kept of one epoch's view (kept
    across opens) are never found for the next: a new open and a new mapping show the new
    epoch, while a mapping made before the change keeps its own epoch."""
    m: Mount = mount({rel: FILES[rel]}, *ARGS)
    m.set_epoch(1)
    one = reference(m.src, rel, 1)
    assert read(m.path(rel)) == one
    fd = os.open(m.path(rel), os.O_RDONLY)
    old = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
    try:
        assert old[:] == one
        for epoch in (2, 1, 3):
            m.set_epoch(epoch)
            want = reference(m.src, rel, epoch)
            assert want != one or epoch == 1
            assert read(m.path(rel)) == want, epoch
            assert shared_map(m.path(rel)) == want, epoch
            assert old[:] == one and os.pread(fd, len(one), 0) == one
    finally:
        old.close()
        os.close(fd)
