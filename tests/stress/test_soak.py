"""Level: stress (a short run by default, five minutes with ``--stress``).

64 readers over a tree of every kind of view (a file, a CSV with quoted newlines, a file in a
directory, the shards of a pool, a fixed-size file, a file replaced by rename every second and a
damaged TFRecord), while one thread sets epochs on the mount, a directory and a file and now and
then a resume state, in both serving modes (page cache, ``--direct-io``).  Every whole read is one
epoch's records of one version of its file, each once; the only errors are the ones the tree
provokes: ``EIO`` from the damaged file, ``ESTALE``/``ENOENT`` from the replaced one.
``SHUFFLEFS_SOAK_SECONDS`` sets the length (default 8 s, 300 s with ``--stress``)."""

from __future__ import annotations

import errno
import json
import os
import random
import struct
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench.lines import numbered_lines, permutation_check  # noqa: E402

READERS = 64
N = 60_000
DATA = numbered_lines(N, 6, 40)
whole = permutation_check(N, 6, 40)
RESUMED = 1_000
"""Records of ``a.jsonl`` a resume state says were consumed."""


def csv_rows(n: int) -> bytes:
    rows = [b'id,text\n'] + [b'%d,"row %d\nspans ""two"" lines"\n' % (i, i) for i in range(n)]
    return b"".join(rows)


def pool_members(k: int, n: int) -> dict[str, bytes]:
    return {f"pool/part-{i:05d}-of-{k:05d}.jsonl":
            b"".join(b'{"m": %d, "j": %d, "pad": "%s"}\n' % (i, j, b"y" * (j % 17)) for j in range(n))
            for i in range(k)}


def tfrecord(payloads: list[bytes]) -> bytes:
    from crc32c import crc32c

    def masked(data: bytes) -> int:
        c = crc32c(data)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    out = bytearray()
    for p in payloads:
        head = struct.pack("<Q", len(p))
        out += head + struct.pack("<I", masked(head)) + p + struct.pack("<I", masked(p))
    return bytes(out)


def damaged_tfrecord() -> bytes:
    data = bytearray(tfrecord([b"payload %d" % i * 50 for i in range(2000)]))
    data[len(data) // 2] ^= 0xFF  # a payload byte: its frame's checksum fails
    return bytes(data)


FIXED = np.arange(40_000, dtype=np.int64).tobytes()
CSV = csv_rows(5_000)
POOL = pool_members(4, 5_000)
VERSIONS = [numbered_lines(5_000 + 1_000 * v, 6, 40) for v in range(3)]


def sorted_lines(data: bytes) -> list[bytes]:
    return sorted(data.splitlines(keepends=True))


def checkers() -> dict[str, object]:
    rest = RESUMED

    def a(data: bytes) -> bool:
        if whole(data):
            return True
        lines = data.splitlines(keepends=True)  # the rest of a resumed epoch: distinct lines of the file
        return len(lines) == N - rest and len(set(lines)) == len(lines) and whole(
            data + b"".join(sorted(set(DATA.splitlines(keepends=True)) - set(lines))))

    csv_sorted = sorted(CSV[len(b"id,text\n"):].split(b'lines"\n'))
    pool_lines = {line for member in POOL.values() for line in member.splitlines(keepends=True)}
    versions = [sorted_lines(v) for v in VERSIONS]

    def csv(data: bytes) -> bool:
        return data.startswith(b"id,text\n") and sorted(data[len(b"id,text\n"):].split(b'lines"\n')) == csv_sorted

    def shard(data: bytes) -> bool:
        lines = data.splitlines(keepends=True)
        return len(set(lines)) == len(lines) and set(lines) <= pool_lines and data.endswith(b"\n")

    def fixed(data: bytes) -> bool:
        return len(data) == len(FIXED) and np.array_equal(np.sort(np.frombuffer(data, np.int64)),
                                                          np.arange(40_000))

    def changing(data: bytes) -> bool:
        return sorted_lines(data) in versions

    return {"a.jsonl": a, "t.csv": csv, "d/b.jsonl": whole, "r.bin": fixed, "changing.jsonl": changing,
            **{name: shard for name in POOL}}


def read_whole(path: Path, rng: random.Random) -> bytes:
    """Front to back, in one of the ways readers do: one read, stdio-sized reads, or preads of
    random sizes."""
    how = rng.randrange(3)
    if how == 0:
        with open(path, "rb") as f:
            return f.read()
    if how == 1:
        with open(path, "rb", buffering=0) as f:
            parts = []
            while chunk := f.read(rng.choice((4096, 65536, 1 << 20))):
                parts.append(chunk)
            return b"".join(parts)
    fd = os.open(path, os.O_RDONLY)
    try:
        size, parts, off = os.fstat(fd).st_size, [], 0
        while off < size:
            chunk = os.pread(fd, rng.randrange(1, 3 << 20), off)
            if not chunk:
                break
            parts.append(chunk)
            off += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


@pytest.mark.parametrize("serving", ["pagecache", "direct-io"])
def test_64_readers_soak_with_only_the_errors_provoked(mount, stress, serving, tmp_path):
    """Holds: SEMANTICS.md#reads-concurrent, SEMANTICS.md#reads-whole-epoch, SEMANTICS.md#changes-open-estale"""
    seconds = float(os.environ.get("SHUFFLEFS_SOAK_SECONDS", 300 if stress else 8))
    files = {"a.jsonl": DATA, "t.csv": CSV, "d/b.jsonl": DATA, "r.bin": FIXED, "changing.jsonl": VERSIONS[0],
             "bad.tfrecord": damaged_tfrecord(), **POOL}
    args = ["--buffer", "1MiB", "--format", "*.bin=fixed:record_size=8"]
    if serving == "direct-io":
        args.append("--direct-io")
    m = mount(files, *args)
    check = checkers()
    names = sorted(check) + ["bad.tfrecord"]
    stop = time.monotonic() + seconds
    problems: list[str] = []
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def note(key: str) -> None:
        with lock:
            counts[key] += 1

    def reader(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < stop and not problems:
            name = rng.choice(names)
            try:
                data = read_whole(m.path(name), rng)
            except OSError as e:
                expected = (name == "bad.tfrecord" and e.errno == errno.EIO) or \
                           (name == "changing.jsonl" and e.errno in (errno.ESTALE, errno.ENOENT))
                if not expected:
                    problems.append(f"{name}: {e!r}")
                note(f"{name} {errno.errorcode.get(e.errno, e.errno)}")
                continue
            if name == "bad.tfrecord":
                problems.append("the damaged TFRecord was read without an error")
            elif not check[name](data):
                problems.append(f"{name}: a whole read ({len(data)} bytes) was not one epoch's records of one version")
            else:
                note(name)

    def flipper() -> None:
        rng, e = random.Random(-1), 0
        while time.monotonic() < stop and not problems:
            e += 1
            try:
                what = rng.randrange(10)
                if what == 0:
                    state = {"epoch": e, "views": {"a.jsonl": [{"world_size": 1, "parts": 1,
                                                               "consumed": [[RESUMED]]}]}}
                    m.set_epoch(e)
                    os.setxattr(m.path(), "user.shufflefs.resume", json.dumps(state).encode())
                elif what < 5:
                    m.set_epoch(e)
                elif what < 8:
                    m.set_epoch(e, "d")
                else:
                    m.set_epoch(e, rng.choice(["t.csv", "pool/part-00001-of-00004.jsonl"]))
                note("epoch set")
            except OSError as err:
                problems.append(f"setting an epoch: {err!r}")
            time.sleep(rng.uniform(0.005, 0.05))

    def replacer() -> None:
        v, src = 0, m.src / "changing.jsonl"
        while time.monotonic() < stop and not problems:
            time.sleep(1.0)
            v = (v + 1) % len(VERSIONS)
            tmp = m.src / ".changing.tmp"
            tmp.write_bytes(VERSIONS[v])
            os.replace(tmp, src)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    threads += [threading.Thread(target=flipper), threading.Thread(target=replacer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(serving, dict(counts))
    assert not problems, (problems[:5], dict(counts))
    for name in ["a.jsonl", "t.csv", "d/b.jsonl", "r.bin", "pool/part-00000-of-00004.jsonl"]:
        assert counts[name] > 0, f"no whole read of {name}: {dict(counts)}"
    assert counts["bad.tfrecord EIO"] > 0
    stats = m.stats()
    blamed = {line for line in stats.get("last_errors", []) if "bad.tfrecord" not in line
              and "changing.jsonl" not in line}
    assert not blamed, f"errors the tree did not provoke: {sorted(blamed)[:5]}"
