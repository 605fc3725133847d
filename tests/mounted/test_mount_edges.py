"""Level: mounted (real FUSE mounts, real readers).

Mounted edge cases: bad files of every format, readers racing epoch changes, odd names and special entries, every strategy over
every format, a busy SIGTERM, empty files of every format, and the index cache's life cycle.

Every view is compared with `layout.render` of the same plan, the reference bytes.
"""

from __future__ import annotations

import errno
import io
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, Link, is_mounted
from shufflefs.config import parse_buffer, parse_size
from shufflefs.formats import parse_format_option, resolve_format, scan_file
from shufflefs.formats.tfrecord import encode_frame
from shufflefs.windows.layout import render
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan

BLOCK, BUFFER, SEED, RECORD = "4KiB", "16KiB", 11, 12
ARGS = ["--block-size", BLOCK, "--buffer", BUFFER, "--seed", str(SEED), "--format", f"*.bin=fixed:record_size={RECORD}"]
RULES = [parse_format_option(f"*.bin=fixed:record_size={RECORD}")]


def reference(src: Path, rel: str | bytes, epoch: int = 0, strategy: str = "stratified") -> bytes:
    """The bytes the view of ``rel`` must have."""
    path = os.path.join(os.fsencode(src), os.fsencode(rel))
    index = scan_file(path, resolve_format(os.fsdecode(rel), RULES, {}))
    spec = ShuffleSpec(strategy=strategy, seed=SEED, block_size=parse_size(BLOCK), buffer=parse_buffer(BUFFER))
    with open(path, "rb") as f:
        return render(index, make_plan(index, spec, epoch), f.read())


def read(path: Path | bytes, chunk: int = 1 << 16) -> bytes:
    parts = []
    with open(path, "rb", buffering=0) as f:
        while b := f.read(chunk):
            parts.append(b)
    return b"".join(parts)


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def jsonl(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * int(rng.integers(0, 80))) for i in range(n))


def tfrecord(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(encode_frame(rng.bytes(int(k))) for k in rng.integers(1, 300, n))


def csv_bytes(n: int) -> bytes:
    return b"id,note\n" + b"".join(b'%d,"two\nlines %d"\n' % (i, i) if i % 9 == 0 else b"%d,plain %d\n" % (i, i)
                                   for i in range(n))


FORMATS = {
    "a.jsonl": jsonl(1500, 1),
    "nonl.txt": b"".join(b"row %d\n" % i for i in range(2000)) + b"last row, no newline",
    "t.csv": csv_bytes(1500),
    "t.tsv": b"a\tb\n" + b"".join(b"%d\t%d\n" % (i, i * i) for i in range(2000)),
    "arr.npy": npy_bytes(np.arange(3000 * 5, dtype=np.int32).reshape(3000, 5)),
    "r.tfrecord": tfrecord(400, 2),
    "f.bin": b"".join(struct.pack("<III", i, i, i) for i in range(3000)),
}


# --------------------------------------------------------------------------- bad input


def test_bad_npy_fixed_and_csv_give_eio_a_log_line_with_file_and_offset_and_a_count(mount):
    """Holds: SEMANTICS.md#errors-eio"""
    good = npy_bytes(np.arange(100 * 10, dtype=np.int64).reshape(100, 10))
    header_end = len(good) - 100 * 10 * 8
    bad = {
        "short.npy": (good[:-3], header_end + 99 * 80),
        "long.npy": (good + b"xyz", len(good)),
        "partial.bin": (b"x" * (RECORD * 50 + 5), RECORD * 50),
        "quote.csv": (b'a,b\n1,"never closed\n2,3\n', 4),
    }
    m = mount({"ok.jsonl": jsonl(50, 3), **{k: v for k, (v, _) in bad.items()}}, *ARGS)
    before = m.stats()["errors"]
    for rel in bad:
        with pytest.raises(OSError) as e:
            read(m.path(rel))
        assert e.value.errno == errno.EIO, rel
    assert read(m.path("ok.jsonl")) == reference(m.src, "ok.jsonl")  # the mount keeps serving the rest
    stats = m.stats()
    assert stats["errors"] >= before + len(bad)
    log = m.stderr()
    for rel, (_, offset) in bad.items():
        assert any(rel in line and f"offset {offset}:" in line for line in stats["last_errors"]), (rel, stats["last_errors"])
        assert re.search(rf"{re.escape(rel)}.*offset {offset}:", log), rel


# --------------------------------------------------------------------------- epochs


def test_every_whole_read_during_epoch_changes_is_exactly_one_epoch(mount):
    """Holds: SEMANTICS.md#reads-whole-epoch, SEMANTICS.md#epochs-handles"""
    m = mount({"a.jsonl": jsonl(3000, 4), "arr.npy": FORMATS["arr.npy"]}, *ARGS)
    epochs = range(4)
    refs = {rel: {reference(m.src, rel, e) for e in epochs} for rel in ("a.jsonl", "arr.npy")}
    assert all(len(r) == len(epochs) for r in refs.values())
    done = threading.Event()
    failures: list[str] = []

    def flip() -> None:
        e = 0
        while not done.is_set():
            e = (e + 1) % len(epochs)
            m.set_epoch(e)
            time.sleep(0.002)  # pacing only; nothing is timed

    def reader(rel: str, chunk: int) -> None:
        try:
            for _ in range(25):
                if read(m.path(rel), chunk) not in refs[rel]:
                    failures.append(f"{rel} read in {chunk}-byte chunks matches no epoch")
        except OSError as e:
            failures.append(f"{rel}: {e}")

    flipper = threading.Thread(target=flip)
    readers = [threading.Thread(target=reader, args=a) for a in
               (("a.jsonl", 4096), ("a.jsonl", 1 << 20), ("arr.npy", 5000), ("arr.npy", 1 << 20))]
    flipper.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join(120)
    done.set()
    flipper.join(30)
    assert not failures, failures[:5]
    assert m.stats()["errors"] == 0


# --------------------------------------------------------------------------- the tree


def test_odd_names_links_and_special_entries(mount):
    """Holds: SEMANTICS.md#tree-mirror, SEMANTICS.md#tree-hidden, SEMANTICS.md#tree-hardlinks, SEMANTICS.md#tree-links, SEMANTICS.md#errors-eloop, SEMANTICS.md#never-opened-own-mount"""
    odd = ["with space.jsonl", "ünïcødé dir/ß.jsonl", "new\nline.jsonl"]
    files = {name: jsonl(300, i) for i, name in enumerate(odd)}
    files.update({
        "a.jsonl": jsonl(800, 9),
        "loop1": Link("loop2"), "loop2": Link("loop1"),
        "self": Link("."),
        "todir": Link("ünïcødé dir"),
    })
    m = mount(files, *ARGS)
    raw = b"\xff\xfe raw.jsonl"  # not valid UTF-8
    with open(os.path.join(os.fsencode(m.src), raw), "wb") as f:
        f.write(jsonl(300, 7))
    os.link(m.src / "a.jsonl", m.src / "hard.jsonl")
    os.mkfifo(m.src / "fifo.jsonl")
    os.symlink(os.path.relpath(m.mnt / "a.jsonl", m.src), m.src / "intomount")  # leaves the tree

    names = set(os.listdir(os.fsencode(m.mnt)))
    assert raw in names and b"new\nline.jsonl" in names and b"with space.jsonl" in names
    assert b"fifo.jsonl" not in names and b"intomount" not in names
    for name in odd:
        assert read(m.path(name)) == reference(m.src, name), name
    raw_path = os.path.join(os.fsencode(m.mnt), raw)
    assert read(raw_path) == reference(m.src, raw)
    os.setxattr(raw_path, "user.shufflefs.epoch", b"3")
    assert os.getxattr(raw_path, "user.shufflefs.epoch") == b"3"
    assert read(raw_path) == reference(m.src, raw, 3)

    assert stat.S_ISLNK(os.lstat(m.path("loop1")).st_mode)
    with pytest.raises(OSError) as e:
        os.stat(m.path("loop1"))
    assert e.value.errno == errno.ELOOP
    assert read(m.path("self/self/a.jsonl")) == reference(m.src, "a.jsonl")
    assert read(m.path("todir/ß.jsonl")) == reference(m.src, "ünïcødé dir/ß.jsonl")
    # a hard link is another path to the same records: the same plan, so the same bytes
    assert read(m.path("hard.jsonl")) == read(m.path("a.jsonl")) == reference(m.src, "a.jsonl")


def test_a_name_with_a_newline_or_an_escape_is_one_line_of_the_log(mount):
    """A name may hold any byte but ``/``: the log writes its control characters escaped, so a
    name cannot forge a record of its own or drive the terminal the log is read on.
    Holds: SEMANTICS.md#tree-mirror"""
    forged = "x\n2026-01-01 00:00:00,000 ERROR shufflefs[1]: forged\x1b[2J.jsonl"
    m = mount({forged: jsonl(300, 1)}, "-v", *ARGS)
    assert read(m.path(forged)) == reference(m.src, forged)
    m.stop()
    lines = m.stderr().splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ", line) for line in lines), lines
    assert not any(line.startswith("2026-01-01 00:00:00,000") for line in lines), lines
    assert any("x\\n2026-01-01 00:00:00,000 ERROR shufflefs[1]: forged\\x1b[2J.jsonl" in line for line in lines), lines


# --------------------------------------------------------------------------- strategies x formats


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_serves_every_format_byte_for_byte(mount, strategy: str):
    """Holds: SEMANTICS.md#views-size, SEMANTICS.md#views-records, SEMANTICS.md#views-order, SEMANTICS.md#epochs-next"""
    m = mount(FORMATS, *ARGS, "--strategy", strategy)
    for epoch in (0, 1):
        if epoch:
            r = subprocess.run([sys.executable, "-m", "shufflefs", "epoch", str(m.mnt), "next"], capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
            assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
        for rel, data in FORMATS.items():
            ref = reference(m.src, rel, epoch, strategy)
            assert os.stat(m.path(rel)).st_size == len(ref) == len(data), rel
            assert read(m.path(rel), 5000) == ref, (rel, epoch)
    arr = np.load(m.path("arr.npy"))
    assert np.array_equal(np.sort(arr[:, 0]), np.arange(0, 3000 * 5, 5))


# --------------------------------------------------------------------------- empty files


def test_zero_byte_files_give_empty_views(mount):
    """Holds: SEMANTICS.md#views-empty"""
    names = ["e.jsonl", "e.ndjson", "e.txt", "e.csv", "e.tsv", "e.tfrecord", "e.bin"]
    m = mount({n: b"" for n in names}, *ARGS)
    for n in names:
        assert os.stat(m.path(n)).st_size == 0, n
        assert read(m.path(n)) == b"", n
        assert m.xattr("records", n) == "0", n


def test_zero_byte_npy_gives_an_empty_view(mount):
    """Holds: SEMANTICS.md#views-empty"""
    m = mount({"e.npy": b""}, *ARGS)
    assert os.stat(m.path("e.npy")).st_size == 0
    assert read(m.path("e.npy")) == b""


# --------------------------------------------------------------------------- lifecycle


def test_sigterm_with_a_file_open_still_unmounts_and_exits_0(mount):
    """Holds: SEMANTICS.md#umount-signals"""
    m = mount({"a.jsonl": jsonl(500, 5)}, *ARGS)
    fd = os.open(m.path("a.jsonl"), os.O_RDONLY)
    try:
        assert os.read(fd, 10) == reference(m.src, "a.jsonl")[:10]
        os.kill(m.pid, signal.SIGTERM)
        assert m.wait() == 0
        assert not is_mounted(m.mnt)
    finally:
        try:
            os.close(fd)
        except OSError:  # ENOTCONN: the daemon that served it is gone, as intended
            pass


# --------------------------------------------------------------------------- the index cache


def test_an_index_built_by_the_cli_is_reused_by_the_mount_unchanged(mount, tmp_path):
    src = tmp_path / "data"
    src.mkdir()
    (src / "a.jsonl").write_bytes(jsonl(2000, 6))
    (src / "arr.npy").write_bytes(FORMATS["arr.npy"])
    link = tmp_path / "data-link"
    link.symlink_to(src)  # the mount names the source another way than the index did
    cache = tmp_path / "shared-cache"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "shufflefs", "index", str(src), "--cache-dir", str(cache)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    entries = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.rglob("*.npz")}
    assert len(entries) == 2
    m = mount(None, *ARGS, "--cache-dir", str(cache), src=link)  # the later --cache-dir wins
    for rel in ("a.jsonl", "arr.npy"):
        assert read(m.path(rel)) == reference(src, rel)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.rglob("*.npz")} == entries
    assert sorted(p.name for p in src.iterdir()) == ["a.jsonl", "arr.npy"]


def test_an_empty_cache_entry_is_rebuilt(mount):
    """Holds: SEMANTICS.md#changes-cache"""
    m = mount({"a.jsonl": jsonl(500, 8)}, *ARGS)
    want = reference(m.src, "a.jsonl")
    assert read(m.path("a.jsonl")) == want
    m.stop()
    entries = list(m.cache.rglob("*.npz"))
    assert entries
    for p in entries:
        p.write_bytes(b"")  # what a crash between create and write-back can leave
    m.start()
    assert read(m.path("a.jsonl")) == want
    assert m.stats()["errors"] == 0


def test_the_default_cache_directory_never_lands_in_the_source(tmp_path):
    """Holds: SEMANTICS.md#never-opened-writes"""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "a.jsonl").write_bytes(jsonl(100, 10))
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(src / ".cache"))
    cmd = [sys.executable, "-m", "shufflefs"]
    try:
        r = subprocess.run([*cmd, "mount", str(src), str(mnt)], capture_output=True, text=True, env=env, timeout=60)
        if r.returncode == 0:  # refusing the mount would be fine too
            read(mnt / "a.jsonl")
            r = subprocess.run([*cmd, "umount", str(mnt)], capture_output=True, text=True, env=env, timeout=60)
            assert r.returncode == 0, r.stderr
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)
    assert sorted(p.name for p in src.rglob("*")) == ["a.jsonl"]


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_empty_and_header_only_fixed_files_give_empty_views_and_a_short_header_is_eio(mount, strategy):
    """Holds: SEMANTICS.md#views-empty, SEMANTICS.md#errors-eio"""
    header = bytes(range(16))
    m = mount({"e.bin": b"", "h.bin": header, "short.bin": header[:5]}, "--block-size", BLOCK, "--buffer", BUFFER,
              "--record-size", "8", "--header-bytes", "16", "--strategy", strategy,
              *(["--world-size", "2", "--rank", "1"] if strategy == "pls" else []))
    assert os.stat(m.path("e.bin")).st_size == 0 and read(m.path("e.bin")) == b""
    assert read(m.path("h.bin")) == header and m.xattr("records", "h.bin") == "0"
    with pytest.raises(OSError) as e:
        read(m.path("short.bin"))
    assert e.value.errno == errno.EIO
    assert "short.bin" in m.stderr() and "header" in m.stderr()
