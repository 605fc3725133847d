"""Level: mounted (real FUSE mounts, real readers).

An index cache entry is a hint, never the truth.  Every entry of a mounted tree (every format,
and a pool of shards) is rewritten as a whole, valid entry whose record bounds are shifted: with
its checksum recomputed (only the framing checks can tell), or with a wrong one (rejected on
load).  Every view then serves exactly its records or fails with EIO; never other bytes; and
after an EIO the next open serves the right bytes, because the entry was dropped."""

from __future__ import annotations

import collections
import csv
import errno
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shufflefs.formats.tfrecord import TFRecordFormat, encode_frame
from shufflefs.index.table import _digest

RECORD = 16
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB", "--format", f"*.bin=fixed:record_size={RECORD}"]


def _jsonl(n: int, seed: int, tag: str) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(json.dumps({"src": tag, "i": i, "t": "x" * int(rng.integers(0, 50))}).encode() + b"\n"
                    for i in range(n))


def _csv() -> bytes:
    rng = np.random.default_rng(3)
    rows = ["id,text,n\n"]
    for i in range(300):
        text = '"a, quoted\nfield ""%d"""' % i if i % 3 == 0 else "plain" + "y" * int(rng.integers(0, 30))
        rows.append(f"{i},{text},{i * 7}\n")
    return "".join(rows).encode()


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(60):
            for ext, data in (("txt", b"sample %d " % i * (i % 7 + 1)), ("cls", b"%d" % (i % 5))):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.arange(600 * 3, dtype=np.int32).reshape(600, 3))
    return out.getvalue()


FILES: dict[str, bytes] = {
    "a.jsonl": _jsonl(400, 0, "a"),
    "b.txt": b"".join(b"line %d %s\n" % (i, b"z" * (i % 13)) for i in range(300)) + b"no newline at the end",
    "c.csv": _csv(),
    "d.npy": _npy(),
    "e.bin": np.arange(500 * RECORD // 4, dtype=np.uint32).tobytes(),
    "f.tfrecord": b"".join(encode_frame(b"frame-%04d-" % i + b"p" * (i % 40)) for i in range(400)),
    "g.tar": _tar(),
    **{f"part-0000{k}.jsonl": _jsonl(n, 10 + k, f"p{k}") for k, n in enumerate((150, 40, 220))},
}
FILES["part-00001.jsonl"] = FILES["part-00001.jsonl"][:-1]  # a member whose last line lacks its newline
POOL = sorted(n for n in FILES if n.startswith("part-"))
VIEWS = [n for n in FILES if not n.startswith("part-")] + ["pool"]
ENTRIES = len(FILES)


def records(name: str, data: bytes) -> collections.Counter:
    """The records of a file of ``name``'s format, parsed by the format's own reader (a view of
    wrong bytes fails to parse or has other records)."""
    if name.endswith((".jsonl", ".txt")):
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        if name.endswith(".jsonl"):
            assert all(json.loads(x) for x in lines)
        return collections.Counter(lines)
    if name.endswith(".csv"):
        rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
        assert rows[0] == ["id", "text", "n"]  # the header stays first
        return collections.Counter(tuple(r) for r in rows[1:])
    if name.endswith(".npy"):
        return collections.Counter(map(tuple, np.load(io.BytesIO(data)).tolist()))
    if name.endswith(".bin"):
        return collections.Counter(data[i: i + RECORD] for i in range(0, len(data), RECORD))
    if name.endswith(".tfrecord"):
        arr = np.frombuffer(data, np.uint8)
        index = TFRecordFormat().scan(arr, name)  # every frame's checksums
        ends = index.bounds[1:].tolist()
        return collections.Counter(data[s + 12: e - 4] for s, e in zip(index.starts.tolist(), ends))
    if name.endswith(".tar"):
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            return collections.Counter((m.name, t.extractfile(m).read()) for m in t.getmembers())
    raise AssertionError(name)


def expected(name: str) -> collections.Counter:
    if name == "pool":
        return sum((records(n, FILES[n]) for n in POOL), collections.Counter())
    return records(name, FILES[name])


def read_view(m, name: str) -> collections.Counter:
    """The view's records (a pool: its shards' together); OSError if the mount refuses."""
    if name == "pool":
        return sum((records(n, (m.path(n)).read_bytes()) for n in POOL), collections.Counter())
    return records(name, m.path(name).read_bytes())


def rewrite_entries(cache: Path, shift: str, consistent: bool) -> int:
    """Rewrite every cache entry as a valid .npz with its bounds shifted (``inner``: all but the
    first and last by one byte; ``all``: every one; ``blocks``: the inner ones by 512 bytes),
    its checksum recomputed if ``consistent``.  Returns how many were rewritten."""
    done = 0
    for f in sorted(cache.rglob("*.npz")):
        with np.load(f) as z:
            bounds, meta = z["bounds"].copy(), json.loads(bytes(z["meta"]).decode())
        if len(bounds) < 3:
            continue
        if shift == "all":
            bounds += 1
        else:
            bounds[1:-1] += 512 if shift == "blocks" else 1
            if not (bounds[1:] > bounds[:-1]).all():
                continue
        meta.pop("sum")
        meta["sum"] = _digest(bounds, meta) if consistent else "0" * 32
        with open(f, "wb") as out:
            np.savez(out, bounds=bounds, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        done += 1
    return done


def first_mount(mount):
    m = mount(FILES, *ARGS)
    for name in VIEWS:
        assert read_view(m, name) == expected(name), name  # indexed and cached
    m.stop()
    return m


@pytest.mark.parametrize("shift", ["inner", "all", "blocks"])
def test_forged_entries_serve_the_records_or_eio_then_the_records(mount, shift):
    """Holds: SEMANTICS.md#changes-cache, SEMANTICS.md#errors-eio"""
    m = first_mount(mount)
    assert rewrite_entries(m.cache, shift, consistent=True) >= (1 if shift == "blocks" else ENTRIES)
    again = mount(None, *ARGS, "--cache-dir", str(m.cache), src=m.src, name="again")
    failed = []
    for name in VIEWS:
        try:
            got = read_view(again, name)
        except OSError as e:
            assert e.errno == errno.EIO, (name, e)
            failed.append(name)
            continue
        assert got == expected(name), f"{name}: wrong records served from a forged index"
    if shift == "inner":  # line, CSV and TFRecord framing caught in the windows, the others on load
        assert {"a.jsonl", "b.txt", "c.csv", "f.tfrecord", "pool"} <= set(failed)
    if shift == "blocks":  # still on the 512-byte grid: the tar framing is caught in the windows
        assert "g.tar" in failed
    if failed:
        log = again.stderr()
        assert "at source offset" in log and "rebuilds it" in log
    for name in failed:  # the entry was dropped: the next open rebuilds the index from the file
        assert read_view(again, name) == expected(name), name
    third = mount(None, *ARGS, "--cache-dir", str(m.cache), src=m.src, name="third")
    for name in VIEWS:
        assert read_view(third, name) == expected(name), name
    assert third.stats()["errors"] == 0


def test_entries_with_a_wrong_checksum_are_rebuilt_silently(mount):
    """Holds: SEMANTICS.md#changes-cache"""
    m = first_mount(mount)
    assert rewrite_entries(m.cache, "inner", consistent=False) == ENTRIES
    again = mount(None, *ARGS, "--cache-dir", str(m.cache), src=m.src, name="again")
    for name in VIEWS:
        assert read_view(again, name) == expected(name), name
    assert again.stats()["errors"] == 0
    for f in m.cache.rglob("*.npz"):  # every entry written again, whole
        with np.load(f) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            assert meta.pop("sum") == _digest(z["bounds"], meta), f
