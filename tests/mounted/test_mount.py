"""Level: mounted (real FUSE mounts, real readers).

Mounted tests: real programs and libraries read shufflefs views through the kernel.

Every view is compared with `layout.render` of the same plan (the reference bytes), and where a
library parses the format, with the source's records as a multiset.  Small blocks and buffers
give every file many windows, so reads cross window boundaries all the time.
"""

from __future__ import annotations

import collections
import csv
import errno
import hashlib
import io
import json
import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import crc32c
import numpy as np
import pytest

from conftest import Link, Mount, is_mounted, wait_for, write_tree
from shufflefs.config import parse_buffer, parse_size
from shufflefs.fs.daemon import READAHEAD_KB
from shufflefs.formats import parse_format_option, resolve_format, scan_file
from shufflefs.windows.layout import Layout, render
from shufflefs.windows.cache import WINDOWS
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.windows.view import window_work

BLOCK, BUFFER, SEED, RECORD = "4KiB", "16KiB", 7, 24
ARGS = ["--block-size", BLOCK, "--buffer", BUFFER, "--seed", str(SEED), "--format", f"*.bin=fixed:record_size={RECORD}"]
RULES = [parse_format_option(f"*.bin=fixed:record_size={RECORD}")]


def spec(strategy: str = "stratified") -> ShuffleSpec:
    return ShuffleSpec(strategy=strategy, seed=SEED, block_size=parse_size(BLOCK), buffer=parse_buffer(BUFFER))


def plan_of(src: Path, rel: str, epoch: int = 0, strategy: str = "stratified", rank: int = 0, world: int = 1):
    index = scan_file(src / rel, resolve_format(rel, RULES, {}))
    return index, make_plan(index, spec(strategy), epoch, rank, world)


def reference(src: Path, rel: str, epoch: int = 0, strategy: str = "stratified", rank: int = 0, world: int = 1) -> bytes:
    """The bytes the view of ``rel`` must have."""
    index, plan = plan_of(src, rel, epoch, strategy, rank, world)
    return render(index, plan, (src / rel).read_bytes())


def lines(data: bytes) -> collections.Counter:
    """Records of a line file (a last line without newline counts as terminated)."""
    if data and not data.endswith(b"\n"):
        data += b"\n"
    return collections.Counter(data.splitlines(keepends=True))


# --------------------------------------------------------------------------- the dataset


def jsonl(n: int, seed: int, width: int = 60) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(
        json.dumps({"id": i, "text": "x" * int(rng.integers(0, width)), "v": float(rng.random())}).encode() + b"\n"
        for i in range(n)
    )


def csv_text(n: int) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["id", "name", "note"])
    for i in range(n):
        note = f"line one\nline two of {i}" if i % 7 == 0 else (f"has, comma {i}" if i % 5 == 0 else f"plain {i}")
        w.writerow([i, f'name "{i}"' if i % 11 == 0 else f"n{i}", note])
    return out.getvalue().encode()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def tfrecords(payloads: list[bytes], path: Path) -> None:
    from tfrecord.writer import TFRecordWriter

    w = TFRecordWriter(str(path))
    for p in payloads:
        w.write({"p": (p, "byte")})
    w.close()


def tf_frames(data: bytes) -> list[bytes]:
    """Raw TFRecord frames, checking both masked CRC-32Cs of each."""

    def masked(b: bytes) -> int:
        c = crc32c.crc32c(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        assert struct.unpack_from("<I", data, pos + 8)[0] == masked(data[pos: pos + 8]), f"length CRC at {pos}"
        payload = data[pos + 12: pos + 12 + length]
        assert struct.unpack_from("<I", data, pos + 12 + length)[0] == masked(payload), f"data CRC at {pos}"
        out.append(data[pos: pos + 16 + length])
        pos += 16 + length
    return out


RNG = np.random.default_rng(1234)
ARR = np.arange(1000 * 6, dtype=np.float64).reshape(1000, 6)
BIG_LINES = b"".join(b"%05d " % i + b"z" * int(RNG.integers(5000, 12000)) + b"\n" for i in range(40))
NONL = b"".join(b"row %d of a text file\n" % i for i in range(2999)) + b"last row without newline"


@pytest.fixture(scope="module")
def data(module_mount) -> Mount:
    files = {
        "a.jsonl": jsonl(3000, 1),
        "nonl.txt": NONL,
        "table.csv": csv_text(3000),
        "arr.npy": npy_bytes(ARR),
        "fixed.bin": b"".join(struct.pack("<QQQ", i, i * i, 7) for i in range(4000)),
        "big.jsonl": BIG_LINES,
        "empty.jsonl": b"",
        "empty.npy": npy_bytes(np.zeros((0, 3), np.int32)),
        "empty.tfrecord": b"",
        "blob.dat": RNG.bytes(50_000),
        "nested/deeper/n.jsonl": jsonl(200, 2),
        "links/rel": Link("../a.jsonl"),
        "links/dir": Link("../nested"),
        "links/out": Link("/etc/passwd"),
        "links/outrel": Link("../../outside.txt"),
        "links/dangling": Link("missing.jsonl"),
        "emptydir": None,
        **{f"many/f{i:03d}.dat": b"%d\n" % i for i in range(300)},
    }
    m = module_mount(files, *ARGS, name="data")
    src = m.src
    (src / "links/abs").symlink_to(src / "a.jsonl")  # absolute, inside the tree
    (src.parent / "outside.txt").write_text("outside\n")
    payloads = [RNG.bytes(int(n)) for n in RNG.integers(1, 400, 600)]
    tfrecords(payloads, src / "recs.tfrecord")
    good = (src / "recs.tfrecord").read_bytes()
    frames = tf_frames(good)
    corrupt = bytearray(good)
    corrupt[sum(map(len, frames[:300])) + 14] ^= 0xFF  # a payload byte: data CRC mismatch
    (src / "bad.tfrecord").write_bytes(bytes(corrupt))
    (src / "trunc.tfrecord").write_bytes(good[: len(good) - 10])
    return m


def read(path: Path, chunk: int = 1 << 16, readahead: bool = True) -> bytes:
    """``readahead=False``: the kernel reads no further ahead than asked, so the daemon gets the
    reads as issued (what a window count depends on)."""
    parts = []
    with open(path, "rb", buffering=0) as f:
        if not readahead:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        while b := f.read(chunk):
            parts.append(b)
    return b"".join(parts)


def error_after_appending(view: Path, source: Path, line: bytes) -> OSError:
    """Open ``view``, read its start, append ``line`` to ``source``, then read on: the error
    the reader gets (the test fails if the read ends without one)."""
    with open(view, "rb", buffering=0) as f:
        assert f.read(100)
        with open(source, "ab") as src:
            src.write(line)
        with pytest.raises(OSError) as e:
            while f.read(1 << 16):
                pass
    return e.value


# --------------------------------------------------------------------------- the tree


def test_listing_mirrors_the_source_tree(data: Mount):
    """Holds: SEMANTICS.md#tree-mirror"""
    hidden = {"links/out", "links/outrel"}
    for dirpath, dirnames, filenames in os.walk(data.src):
        rel = os.path.relpath(dirpath, data.src)
        expect = sorted(
            n for n in dirnames + filenames if os.path.normpath(os.path.join(rel, n)) not in hidden
        )
        assert sorted(os.listdir(data.path(rel))) == expect, rel
    # a real `ls` of a directory larger than one readdir buffer: no entry lost or repeated
    out = subprocess.run(["ls", "-1", str(data.path("many"))], capture_output=True, check=True, text=True).stdout
    assert out.split() == [f"f{i:03d}.dat" for i in range(300)]
    assert os.listdir(data.path("emptydir")) == []


def test_sizes_and_types(data: Mount):
    """Holds: SEMANTICS.md#views-size, SEMANTICS.md#tree-attrs"""
    for rel in ["a.jsonl", "table.csv", "arr.npy", "fixed.bin", "big.jsonl", "blob.dat", "recs.tfrecord", "many/f007.dat"]:
        st = os.stat(data.path(rel))
        assert st.st_size == (data.src / rel).stat().st_size, rel
        assert st.st_mode == (data.src / rel).stat().st_mode
    assert os.stat(data.path("nonl.txt")).st_size == len(NONL)  # the last line given last, unchanged
    assert os.path.isdir(data.path("nested/deeper"))
    assert os.stat(data.path("empty.jsonl")).st_size == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the readahead of a mount is set by root")
def test_the_mount_reads_ahead_a_whole_request(data: Mount):
    """Page-cache views (fixed, npy) get 1 MiB readahead, not the 128 KiB a FUSE mount starts with."""
    dev = os.stat(data.mnt).st_dev
    knob = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    deadline = time.monotonic() + 10
    while knob.read_text().strip() != str(READAHEAD_KB) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert knob.read_text().strip() == str(READAHEAD_KB) == "1024"


def test_symlinks_inside_the_tree_resolve_inside_the_mount(data: Mount):
    """Holds: SEMANTICS.md#tree-links, SEMANTICS.md#tree-hidden, SEMANTICS.md#tree-attrs"""
    assert os.readlink(data.path("links/rel")) == "../a.jsonl"
    assert os.readlink(data.path("links/abs")) == "../a.jsonl"  # absolute target rewritten
    assert os.readlink(data.path("links/dir")) == "../nested"
    assert os.readlink(data.path("links/dangling")) == "missing.jsonl"
    assert os.lstat(data.path("links/abs")).st_size == len("../a.jsonl")
    for hidden in ("links/out", "links/outrel"):
        assert not os.path.lexists(data.path(hidden))
    view = read(data.path("a.jsonl"))
    assert read(data.path("links/rel")) == view
    assert read(data.path("links/abs")) == view
    assert read(data.path("links/dir/deeper/n.jsonl")) == reference(data.src, "nested/deeper/n.jsonl")


def test_unknown_files_pass_through_unchanged(data: Mount):
    """Holds: SEMANTICS.md#tree-views, SEMANTICS.md#epochs-passthrough, SEMANTICS.md#errors-enodata"""
    assert read(data.path("blob.dat"), 7000) == (data.src / "blob.dat").read_bytes()
    assert read(data.path("many/f123.dat")) == b"123\n"
    with pytest.raises(OSError) as e:
        os.getxattr(data.path("blob.dat"), "user.shufflefs.epoch")
    assert e.value.errno == errno.ENODATA


# --------------------------------------------------------------------------- whole-file readers


@pytest.mark.parametrize("rel", ["a.jsonl", "nonl.txt", "big.jsonl", "nested/deeper/n.jsonl"])
def test_cat_equals_render_and_sorted_records_equal(data: Mount, rel: str):
    """Holds: SEMANTICS.md#views-records, SEMANTICS.md#views-order"""
    out = subprocess.run(["cat", str(data.path(rel))], capture_output=True, check=True).stdout
    ref = reference(data.src, rel)
    assert out == ref
    source = (data.src / rel).read_bytes()
    assert out != source and len(out) == len(source), "the view must be shuffled"
    env = dict(os.environ, LC_ALL="C")

    def sorted_sha(path: Path) -> str:
        return subprocess.run(f"sort '{path}' | sha256sum", shell=True, capture_output=True, check=True,
                              env=env, text=True).stdout.split()[0]

    assert sorted_sha(data.path(rel)) == sorted_sha(data.src / rel)
    assert lines(out) == lines(source)


def test_records_larger_than_a_block(data: Mount):
    index, plan = plan_of(data.src, "big.jsonl")
    assert index.lengths.min() > parse_size(BLOCK)
    view = read(data.path("big.jsonl"), 3000)
    assert view == reference(data.src, "big.jsonl")
    assert lines(view) == lines(BIG_LINES)


def test_json_lines_parse(data: Mount):
    """Holds: SEMANTICS.md#views-records"""
    with open(data.path("a.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    src = [json.loads(line) for line in (data.src / "a.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(3000))
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert sorted(map(key, rows)) == sorted(map(key, src))
    assert [r["id"] for r in rows] != list(range(3000))


def test_csv_header_first_and_rows_equal(data: Mount):
    """Holds: SEMANTICS.md#views-records"""
    with open(data.path("table.csv"), newline="") as f:
        got = list(csv.reader(f))
    with open(data.src / "table.csv", newline="") as f:
        want = list(csv.reader(f))
    assert got[0] == want[0] == ["id", "name", "note"]
    assert sorted(got[1:]) == sorted(want[1:])
    assert got[1:] != want[1:]
    assert any("\n" in row[2] for row in got[1:])  # quoted newlines stayed inside their records
    assert read(data.path("table.csv")) == reference(data.src, "table.csv")


def test_numpy_load_plain_and_mmap(data: Mount):
    """Holds: SEMANTICS.md#views-records, SEMANTICS.md#views-pagecache"""
    path = data.path("arr.npy")
    plain = np.load(path)
    mapped = np.load(path, mmap_mode="r")  # a shared mapping: needs the page cache
    assert plain.dtype == ARR.dtype and plain.shape == ARR.shape
    assert np.array_equal(np.asarray(mapped), plain)
    assert np.array_equal(np.sort(plain[:, 0]), ARR[:, 0])
    order = (plain[:, 0] // 6).astype(int)
    assert np.array_equal(plain, ARR[order])  # whole rows moved
    assert not np.array_equal(order, np.arange(len(ARR)))
    ref = reference(data.src, "arr.npy")
    assert read(path) == ref
    header_end = plan_of(data.src, "arr.npy")[0].header_end
    assert ref[:header_end] == (data.src / "arr.npy").read_bytes()[:header_end]
    del mapped


def test_tfrecord_reader(data: Mount):
    """Holds: SEMANTICS.md#views-records"""
    from tfrecord.reader import tfrecord_iterator

    got = [bytes(r) for r in tfrecord_iterator(str(data.path("recs.tfrecord")))]
    want = [bytes(r) for r in tfrecord_iterator(str(data.src / "recs.tfrecord"))]
    assert collections.Counter(got) == collections.Counter(want)
    assert got != want
    view = read(data.path("recs.tfrecord"))
    frames = tf_frames(view)  # every CRC checks out
    assert len(frames) == len(want)
    assert view == reference(data.src, "recs.tfrecord")


def test_fixed_size_records(data: Mount):
    """Holds: SEMANTICS.md#views-records, SEMANTICS.md#views-pagecache"""
    view = read(data.path("fixed.bin"), 5000)
    assert view == reference(data.src, "fixed.bin")
    recs = np.frombuffer(view, dtype="<u8").reshape(-1, 3)
    assert np.array_equal(np.sort(recs[:, 0]), np.arange(4000))
    assert np.array_equal(recs[:, 1], recs[:, 0] ** 2) and (recs[:, 2] == 7).all()
    assert data.xattr("format", "fixed.bin") == "fixed"
    mapped = np.memmap(data.path("fixed.bin"), dtype="<u8", mode="r")  # shared mapping
    assert mapped.tobytes() == view
    del mapped


def test_empty_files(data: Mount):
    """Holds: SEMANTICS.md#views-empty"""
    assert read(data.path("empty.jsonl")) == b""
    assert read(data.path("empty.tfrecord")) == b""
    arr = np.load(data.path("empty.npy"))
    assert arr.shape == (0, 3) and arr.dtype == np.int32
    assert data.xattr("records", "empty.jsonl") == "0"


# --------------------------------------------------------------------------- random access and concurrency


def test_random_preads_match_render(data: Mount):
    """Holds: SEMANTICS.md#reads-pread"""
    rng = np.random.default_rng(5)
    for rel in ["a.jsonl", "table.csv", "fixed.bin", "arr.npy", "recs.tfrecord", "nonl.txt"]:
        ref = reference(data.src, rel)
        index, plan = plan_of(data.src, rel)
        starts = Layout(index, plan).window_starts
        assert len(starts) > 3, "the test needs several windows"
        fd = os.open(data.path(rel), os.O_RDONLY)
        try:
            offsets = list(rng.integers(0, len(ref) + 10, 40)) + [int(s) - 5 for s in starts[1:]] + [0, len(ref)]
            for off in offsets:
                off = max(0, int(off))
                size = int(rng.choice([1, 17, 4096, 10_000, 70_000]))
                assert os.pread(fd, size, off) == ref[off: off + size], (rel, off, size)
        finally:
            os.close(fd)


def test_eight_concurrent_readers_get_identical_bytes(mount):
    """Holds: SEMANTICS.md#reads-concurrent"""
    m = mount({"a.jsonl": jsonl(4000, 11)}, *ARGS, "-v")
    ref = reference(m.src, "a.jsonl")
    results: list[bytes | BaseException] = [b""] * 8
    barrier = threading.Barrier(8)

    def reader(i: int) -> None:
        try:
            barrier.wait()
            results[i] = read(m.path("a.jsonl"), [4096, 1000, 65536, 3333, 8192, 131072, 777, 20000][i])
        except BaseException as e:  # reported below
            results[i] = e

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in results:
        assert r == ref
    # the opens raced, yet the index was built once, into the cache directory (not the source)
    assert m.stderr().count("index of a.jsonl:") == 1
    assert len(list(m.cache.rglob("*.npz"))) == 1
    assert sorted(p.name for p in m.src.iterdir()) == ["a.jsonl"]


def test_sequential_reader_loads_each_window_once_within_the_budget(data: Mount):
    """Holds: SEMANTICS.md#memory-windows"""
    index, plan = plan_of(data.src, "a.jsonl")
    ref = reference(data.src, "a.jsonl")
    with open(data.path("a.jsonl"), "rb", buffering=0) as f:  # pages kept from earlier reads let go
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    before = data.stats()
    with open(data.path("a.jsonl"), "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: reads arrive as issued
        got = b"".join(iter(lambda: f.read(4096), b""))
        during = data.stats()
    assert got == ref
    memory = during["memory"]
    assert memory["loads"] - before["memory"]["loads"] == plan.n_windows  # prefetched, never reloaded
    assert memory["prefetched"] - before["memory"]["prefetched"] == plan.n_windows - 1
    # memory: a few windows of the largest view in memory, for all views together, never more
    assert memory["limit_bytes"] >= WINDOWS * int(plan.window_sizes.max())
    assert memory["window_bytes"] + memory["pooled_bytes"] <= memory["limit_bytes"]
    assert during["views"] == before["views"] + 1
    assert during["bytes_served"] - before["bytes_served"] == len(ref)
    wait_for(lambda: data.stats()["views"] == before["views"], "the view to close")  # RELEASE comes after close()
    after = data.stats()
    assert after["memory"]["window_bytes"] + after["memory"]["pooled_bytes"] <= after["memory"]["limit_bytes"]


def test_window_memory_is_three_windows_of_the_largest_view_in_memory_and_one_load(mount):
    """Holds: SEMANTICS.md#memory-windows, SEMANTICS.md#memory-idle"""
    m = mount({"a.jsonl": jsonl(3000, 21), "b.jsonl": jsonl(3000, 22, width=400)}, *ARGS)
    largest = {rel: int(plan_of(m.src, rel)[1].window_sizes.max()) for rel in ("a.jsonl", "b.jsonl")}
    work = {rel: window_work(plan_of(m.src, rel)[1]) for rel in largest}  # a load's working memory
    assert largest["a.jsonl"] != largest["b.jsonl"]

    def check(views: set[str]) -> dict:
        memory = m.stats()["memory"]
        most = max(largest[v] for v in views)
        assert memory["limit_bytes"] == WINDOWS * most + max(0, max(work[v] for v in views) - most)
        assert memory["window_bytes"] + memory["pooled_bytes"] <= memory["limit_bytes"]
        return memory

    refs = {rel: reference(m.src, rel) for rel in largest}
    with open(m.path("a.jsonl"), "rb", buffering=0) as fa:
        got = {"a.jsonl": fa.read(5000)}
        check({"a.jsonl"})
        fb = open(m.path("b.jsonl"), "rb", buffering=0)
        got["b.jsonl"] = fb.read(5000)
        check({"a.jsonl", "b.jsonl"})
        # two sequential readers in turn: both keep their window, neither reloads one per read
        while True:
            x, y = fa.read(3000), fb.read(3000)
            if not x and not y:
                break
            got["a.jsonl"] += x
            got["b.jsonl"] += y
            check({"a.jsonl", "b.jsonl"})
        during = m.stats()["memory"]
        fb.close()
    assert got == refs
    windows = sum(plan_of(m.src, rel)[1].n_windows for rel in largest)
    assert during["loads"] <= 2 * windows  # not one load per read: each reader keeps its window
    # closed views stay idle with their windows, within the same limit
    assert m.stats()["views"] == 0 and m.stats()["idle_views"] == 2
    check({"a.jsonl", "b.jsonl"})


# --------------------------------------------------------------------------- read-only and xattrs


def test_every_mutation_is_refused(data: Mount):
    """Holds: SEMANTICS.md#errors-erofs, SEMANTICS.md#never-opened-writes"""
    before = {p: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
              for p in data.src.rglob("*") if p.is_file() and not p.is_symlink()}
    f = str(data.path("a.jsonl"))
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
        for target in (f, str(data.path("blob.dat"))):
            with pytest.raises(OSError) as e:
                os.close(os.open(target, flags))
            assert e.value.errno == errno.EROFS, (target, flags)
    checks = [
        lambda: os.close(os.open(data.path("new.jsonl"), os.O_CREAT | os.O_WRONLY, 0o644)),
        lambda: os.mkdir(data.path("newdir")),
        lambda: os.unlink(f),
        lambda: os.rmdir(data.path("emptydir")),
        lambda: os.rename(f, data.path("moved.jsonl")),
        lambda: os.truncate(f, 0),
        lambda: os.chmod(f, 0o600),
        lambda: os.utime(f, (0, 0)),
        lambda: os.symlink("a.jsonl", data.path("s")),
        lambda: os.link(f, data.path("h")),
        lambda: os.mknod(data.path("fifo"), 0o600 | 0o010000),
    ]
    for i, check in enumerate(checks):
        with pytest.raises(OSError) as e:
            check()
        assert e.value.errno == errno.EROFS, i
    r = subprocess.run(["sh", "-c", f"echo x >> '{f}'"], capture_output=True, text=True)
    assert r.returncode != 0 and "Read-only file system" in r.stderr
    after = {p: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
             for p in data.src.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before
    statfs = os.statvfs(data.path())
    assert statfs.f_bsize > 0 and statfs.f_namemax >= 255


def test_xattrs_describe_views_and_mount(data: Mount):
    """Holds: SEMANTICS.md#errors-enodata, SEMANTICS.md#errors-eperm, SEMANTICS.md#errors-erofs"""
    names = set(os.listxattr(data.path("a.jsonl")))
    assert {f"user.shufflefs.{n}" for n in
            ("epoch", "strategy", "seed", "records", "windows", "format", "block_size", "buffer", "info")} <= names
    assert {"user.shufflefs.epoch", "user.shufflefs.stats", "user.shufflefs.pid"} <= set(os.listxattr(data.path()))
    index, plan = plan_of(data.src, "a.jsonl")
    assert data.xattr("strategy", "a.jsonl") == "stratified"  # the default
    assert data.xattr("seed", "a.jsonl") == str(SEED)
    assert data.xattr("records", "a.jsonl") == "3000" == str(index.n)
    assert data.xattr("windows", "a.jsonl") == str(plan.n_windows)
    assert data.xattr("block_size", "a.jsonl") == "4096"
    assert data.xattr("format", "a.jsonl") == "lines"
    info = json.loads(data.xattr("info", "a.jsonl"))
    assert info["records"] == 3000 and info["windows"] == plan.n_windows and info["format"] == "lines"
    assert data.xattr("pid") == str(data.pid)
    stats = data.stats()
    assert stats["pid"] == data.pid and stats["strategy"] == "stratified" and stats["seed"] == SEED
    assert stats["source"] == str(data.src) and stats["mountpoint"] == str(data.mnt)
    for key in ("epoch", "files_opened", "views", "bytes_served", "reads", "errors", "last_errors"):
        assert key in stats
    with pytest.raises(OSError) as e:
        os.getxattr(data.path("a.jsonl"), "user.shufflefs.nonsense")
    assert e.value.errno == errno.ENODATA
    for name in ("user.shufflefs.epoch", "user.shufflefs.records"):
        with pytest.raises(OSError) as e:
            os.removexattr(data.path("a.jsonl"), name)
        assert e.value.errno in (errno.EPERM, errno.EROFS)
    with pytest.raises(OSError) as e:
        os.removexattr(data.path("a.jsonl"), "user.other")
    assert e.value.errno == errno.ENODATA
    with pytest.raises(OSError) as e:
        os.setxattr(data.path("a.jsonl"), "user.shufflefs.records", b"5")
    assert e.value.errno in (errno.EPERM, errno.EROFS)


@pytest.mark.parametrize("value", [b"abc", b"-1", b"1.5", b"", b" ", b"1 2", b"0x10", b"\xff", b" 0", b"0 "])
def test_invalid_epoch_values_are_einval(data: Mount, value: bytes):
    """Holds: SEMANTICS.md#epochs-values, SEMANTICS.md#errors-einval"""
    for rel in ("", "a.jsonl"):
        with pytest.raises(OSError) as e:
            os.setxattr(data.path(rel), "user.shufflefs.epoch", value)
        assert e.value.errno == errno.EINVAL
    assert data.xattr("epoch") == "0" and data.xattr("epoch", "a.jsonl") == "0"
    data.set_epoch("0\n")  # one trailing newline after a valid value is fine (as echo writes it)
    assert data.xattr("epoch") == "0"


def test_corrupt_tfrecords_give_eio(data: Mount):
    """Holds: SEMANTICS.md#errors-eio"""
    errors_before = data.stats()["errors"]
    for rel in ("bad.tfrecord", "trunc.tfrecord"):
        with pytest.raises(OSError) as e:
            read(data.path(rel))
        assert e.value.errno == errno.EIO, rel
    stats = data.stats()
    assert stats["errors"] >= errors_before + 2
    assert any("bad.tfrecord" in line for line in stats["last_errors"])
    assert any("trunc.tfrecord" in line for line in stats["last_errors"])
    assert "bad.tfrecord" in data.stderr()  # logged too


# --------------------------------------------------------------------------- epochs


def test_epoch_switch_on_root_and_on_one_file(mount):
    """Holds: SEMANTICS.md#epochs-root, SEMANTICS.md#epochs-file, SEMANTICS.md#epochs-read, SEMANTICS.md#epochs-handles"""
    m = mount({"a.jsonl": jsonl(2000, 3), "arr.npy": npy_bytes(ARR[:600]), "b.jsonl": jsonl(500, 4)}, *ARGS)
    e0, e1 = reference(m.src, "a.jsonl", 0), reference(m.src, "a.jsonl", 1)
    assert e0 != e1
    old = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        head = os.read(old, 5000)
        old_map = np.load(m.path("arr.npy"), mmap_mode="r")
        first_npy = read(m.path("arr.npy"))  # fills the page cache of the epoch-0 inode
        subprocess.run(["setfattr", "-n", "user.shufflefs.epoch", "-v", "1", str(m.mnt)], check=True)
        assert m.xattr("epoch") == "1" and m.xattr("epoch", "a.jsonl") == "1"
        assert read(m.path("a.jsonl")) == e1
        assert read(m.path("arr.npy")) == reference(m.src, "arr.npy", 1) != first_npy
        assert np.array_equal(np.load(m.path("arr.npy"), mmap_mode="r"), np.load(io.BytesIO(reference(m.src, "arr.npy", 1))))
        # the handle opened before the change keeps its epoch, and so does the old mapping
        rest = b"".join(iter(lambda: os.read(old, 7777), b""))
        assert head + rest == e0
        assert np.array_equal(old_map, np.load(io.BytesIO(first_npy)))
        del old_map
    finally:
        os.close(old)
    # one file only
    subprocess.run(["setfattr", "-n", "user.shufflefs.epoch", "-v", "5", str(m.path("a.jsonl"))], check=True)
    assert m.xattr("epoch", "a.jsonl") == "5" and m.xattr("epoch", "b.jsonl") == "1"
    assert read(m.path("a.jsonl")) == reference(m.src, "a.jsonl", 5)
    assert read(m.path("b.jsonl")) == reference(m.src, "b.jsonl", 1)
    out = subprocess.run(["getfattr", "--only-values", "-n", "user.shufflefs.epoch", str(m.path("a.jsonl"))],
                         capture_output=True, check=True).stdout
    assert out.strip() == b"5"
    # the root sets every file again, clearing the override
    m.set_epoch(2)
    assert m.xattr("epoch", "a.jsonl") == "2"
    assert read(m.path("a.jsonl")) == reference(m.src, "a.jsonl", 2)
    assert m.stats()["epoch"] == 2


def _wait_for(m: Mount, cond, what: str, timeout: float = 20.0) -> dict:
    """Poll the mount's stats until ``cond(stats)`` holds (background work has no reply to wait for)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = m.stats()
        if cond(stats):
            return stats
        assert time.monotonic() < deadline, f"{what} did not happen: {stats}"
        time.sleep(0.01)


def test_an_epoch_change_loads_window_zero_of_recently_opened_files(mount):
    """Holds: SEMANTICS.md#memory-idle, SEMANTICS.md#epochs-dir, SEMANTICS.md#epochs-file"""
    files = {"a.jsonl": jsonl(3000, 31), "d/b.jsonl": jsonl(2000, 32), "d/c.jsonl": jsonl(2000, 33)}
    m = mount(files, *ARGS)
    for rel in ("a.jsonl", "d/b.jsonl"):  # c.jsonl is never opened
        assert read(m.path(rel), 4096) == reference(m.src, rel, 0)
    before = m.stats()
    m.set_epoch(1)
    ready = _wait_for(m, lambda s: s["epoch_prefetches"] - before["epoch_prefetches"] == 2
                      and s["memory"]["loads"] - before["memory"]["loads"] == 2, "preparing epoch 1")
    assert ready["memory"]["prefetched"] - before["memory"]["prefetched"] == 2
    # prepared views wait, without a handle, for their first open; the epoch 0 views, which no
    # name leads to any more, were closed (with their plans and windows)
    assert ready["idle_views"] == 2
    for rel in ("a.jsonl", "d/b.jsonl"):
        loads = m.stats()["memory"]["loads"]
        # reads smaller than a window: the reader holds one window and prefetches the next, so
        # the other file's prepared window keeps its place in memory (3 windows)
        assert read(m.path(rel), 4096, readahead=False) == reference(m.src, rel, 1)
        # window 0 was waiting: the read loaded only the other windows
        assert m.stats()["memory"]["loads"] - loads == plan_of(m.src, rel, 1)[1].n_windows - 1, rel
    # a directory's epoch prepares only the recent files under it; a file's only that file
    before = m.stats()
    m.set_epoch(2, "d")
    _wait_for(m, lambda s: s["epoch_prefetches"] - before["epoch_prefetches"] == 1, "preparing d/ for epoch 2")
    m.set_epoch(3, "a.jsonl")
    after = _wait_for(m, lambda s: s["epoch_prefetches"] - before["epoch_prefetches"] == 2, "preparing a.jsonl")
    assert after["errors"] == 0
    assert read(m.path("d/b.jsonl")) == reference(m.src, "d/b.jsonl", 2)
    assert read(m.path("d/c.jsonl")) == reference(m.src, "d/c.jsonl", 2)
    assert read(m.path("a.jsonl")) == reference(m.src, "a.jsonl", 3)
    time.sleep(0.2)
    assert m.stats()["epoch_prefetches"] == after["epoch_prefetches"]


# --------------------------------------------------------------------------- a changing source


def test_source_modified_or_removed_while_mounted(mount):
    """Holds: SEMANTICS.md#changes-open-estale, SEMANTICS.md#changes-new-open, SEMANTICS.md#errors-estale, SEMANTICS.md#errors-enoent"""
    m = mount({"a.jsonl": jsonl(30000, 5), "b.jsonl": jsonl(30000, 6)}, *ARGS)
    fa = os.open(m.path("a.jsonl"), os.O_RDONLY)
    fb = os.open(m.path("b.jsonl"), os.O_RDONLY)
    old = {fa: reference(m.src, "a.jsonl"), fb: reference(m.src, "b.jsonl")}
    try:
        assert os.pread(fa, 100, 0) == reference(m.src, "a.jsonl")[:100]
        assert len(os.pread(fb, 100, 0)) == 100
        with open(m.src / "a.jsonl", "ab") as f:
            f.write(b'{"id": "new"}\n')
        os.unlink(m.src / "b.jsonl")
        for fd in (fa, fb):
            # even bytes of a window loaded before the change are refused; pages the kernel
            # cached before it (readahead took in the whole small file) are of the old version
            try:
                assert os.pread(fd, 100, 100) == old[fd][100:200]
            except OSError as e:
                assert e.errno in (errno.EIO, errno.ESTALE)
            with pytest.raises(OSError) as e:
                os.pread(fd, 100, 1 << 20)  # past every page cached: the daemon refuses it
            assert e.value.errno in (errno.EIO, errno.ESTALE)
    finally:
        os.close(fa)
        os.close(fb)
    stats = m.stats()
    assert stats["errors"] >= 2
    assert any("a.jsonl" in line and "offset" in line for line in stats["last_errors"])
    assert "a.jsonl" in m.stderr()
    # a new open sees the new file; the removed one is gone
    assert lines(read(m.path("a.jsonl"))) == lines((m.src / "a.jsonl").read_bytes())
    with pytest.raises(FileNotFoundError):  # at once for an open (a stat may see the name a second more)
        open(m.path("b.jsonl"), "rb")
    assert not os.path.exists(m.path("b.jsonl"))


# --------------------------------------------------------------------------- strategies and ranks


@pytest.mark.parametrize("strategy,rank,world", [
    ("none", 0, 1), ("once", 0, 1), ("full", 0, 1), ("lirs-page", 0, 1), ("block", 0, 1), ("window", 0, 1),
    ("corgipile", 1, 2),
])
def test_strategies_through_the_mount(mount, strategy: str, rank: int, world: int):
    """Holds: SEMANTICS.md#views-order, SEMANTICS.md#views-size, SEMANTICS.md#ranks-share"""
    m = mount({"a.jsonl": jsonl(1500, 8), "r.tfrecord": b""}, *ARGS, "--strategy", strategy,
              "--rank", str(rank), "--world", str(world))
    ref = reference(m.src, "a.jsonl", 0, strategy, rank, world)
    assert os.stat(m.path("a.jsonl")).st_size == len(ref)
    assert read(m.path("a.jsonl"), 5000) == ref
    if world == 1:
        assert lines(ref) == lines((m.src / "a.jsonl").read_bytes())


# --------------------------------------------------------------------------- lifecycle


def test_mount_is_listed_as_fuse_shufflefs(data: Mount):
    with open("/proc/mounts") as f:
        entries = [line.split() for line in f]
    assert [e[0] for e in entries if e[1] == str(data.mnt) and e[2] == "fuse.shufflefs"] == [f"shufflefs:{data.src}"]


def test_daemon_refuses_unusable_paths(tmp_path: Path, capsys):
    """Holds: SEMANTICS.md#never-opened-own-mount"""
    from shufflefs.config import MountConfig
    from shufflefs.fs.daemon import run

    src, mnt = write_tree(tmp_path / "src", {"a.jsonl": b"1\n"}), tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "busy").write_text("x")
    cases = {
        "not empty": MountConfig(src, mnt),
        "does not exist": MountConfig(tmp_path / "nope", tmp_path / "nope2"),
        "inside the source": MountConfig(src, src / "sub"),
    }
    (src / "sub").mkdir()
    for words, config in cases.items():
        config.cache_dir = tmp_path / "cache"
        assert run(config) == 2
        assert words in capsys.readouterr().err
    assert not is_mounted(mnt) and not is_mounted(src / "sub")


def test_sigterm_unmounts_cleanly(mount):
    """Holds: SEMANTICS.md#umount-signals"""
    m = mount({"a.jsonl": jsonl(100, 9)}, *ARGS)
    assert read(m.path("a.jsonl")) == reference(m.src, "a.jsonl")
    os.kill(m.pid, signal.SIGTERM)
    assert m.wait() == 0
    assert not is_mounted(m.mnt)
    assert os.listdir(m.mnt) == []


def test_fusermount_unmount_ends_the_daemon(mount):
    """Holds: SEMANTICS.md#umount-clean"""
    m = mount({"a.jsonl": jsonl(100, 9)}, *ARGS)
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    os.read(fd, 10)
    os.close(fd)
    subprocess.run(["fusermount3", "-u", str(m.mnt)], check=True)
    assert m.wait() == 0
    assert not is_mounted(m.mnt)
