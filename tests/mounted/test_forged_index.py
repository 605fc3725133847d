"""Level: mounted (real FUSE mounts, real readers).

A published index (``shufflefs index SRC --publish --index-dir DIR``) is written by other people
and other jobs, so it is trusted no more than a cache entry: here entries are forged the way
anyone who can write DIR can, whole and with their checksum recomputed so that they load, with
every bound where a record can end: every second bound of a JSON-lines or CSV file dropped (pairs
of lines as one record), two tar samples merged or one cut in two, two TFRecord frames merged.
The reader gets EIO naming the file and offset (in the log and ``user.shufflefs.error``), that
published entry is never taken again by the mount, and the next open serves what a mount without
it serves, byte for byte: for single files, a pool's shards, a mixture's and a resumed epoch.
An entry that fails its check on load is not an EIO at all: the file is indexed here.

A tar index that cuts a sample in two with the halves in different windows (or one in none: in
another rank's partition, outside a stretch a mixture takes), or that moves a directory to the
sample before it (as many records, each of one key), is EIO at the first window holding either
record: every byte served before the EIO is whole samples of the file."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from conftest import write_tree
from shufflefs.formats import resolve_format
from shufflefs.formats.tar import TarFormat
from shufflefs.formats.tfrecord import encode_frame
from shufflefs.index.table import IndexCache, RecordIndex, SourceStamp, _digest, cache_key
from shufflefs.strategies import ShuffleSpec, make_plan
from shufflefs.strategies.partial_local import pls_exchange
from shufflefs.windows.layout import render
from test_mount import csv_text, jsonl, lines

ARGS = ["--block-size", "8KiB", "--buffer", "64KiB", "--seed", "5"]
ERROR = "user.shufflefs.error"


def tar_bytes(n: int, first: int = 0) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(first, first + n):
            for ext, data in (("jpg", b"image %d " % i * (i % 9 + 1)), ("cls", b"%d" % (i % 10))):
                info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def tar_samples(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return [m.name for m in t.getmembers()]


def members_of(data: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return [m.offset for m in t.getmembers()]


def drop_every_second(bounds: np.ndarray, data: bytes) -> np.ndarray:
    return np.concatenate((bounds[:1], bounds[1:-1][1::2], bounds[-1:]))


def merge_one(bounds: np.ndarray, data: bytes) -> np.ndarray:
    return np.delete(bounds, len(bounds) // 2)


def cut_a_sample(bounds: np.ndarray, data: bytes) -> np.ndarray:
    """A bound between the two members of a tar sample: each half has one key."""
    mid = int(bounds[len(bounds) // 2])
    second = min(o for o in members_of(data) if o > mid)
    return np.sort(np.append(bounds, second))


FILES = {
    "a.jsonl": jsonl(3000, 1),
    "c.csv": csv_text(1500),
    "d.tfrecord": b"".join(encode_frame(b"frame %05d " % i + b"p" * (i % 300)) for i in range(1500)),
    "e.tar": tar_bytes(400),
}
MERGED = ("two sample keys in one record", "the record before it in its file is not one whole sample")
"""Two tar samples as one record: found in that record, or in the next as the record before it."""
FORGERIES: dict[str, tuple[str, Callable[[np.ndarray, bytes], np.ndarray], str | tuple[str, ...]]] = {
    "lines": ("a.jsonl", drop_every_second, "a newline inside a line"),
    "csv rows": ("c.csv", drop_every_second, "a newline outside quotes inside a row"),
    "tfrecord frames": ("d.tfrecord", merge_one, "length field is not the record's length"),
    "tar samples merged": ("e.tar", merge_one, MERGED),
    "tar sample cut": ("e.tar", cut_a_sample, "same sample key"),
}


def cli(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def publish(src: Path, shared: Path, *args: str) -> None:
    shared.mkdir(exist_ok=True)
    r = cli("index", src, "--publish", "--index-dir", shared, *args)
    assert r.returncode == 0, r.stderr


def entry_of(shared: Path, src: Path, rel: str) -> Path:
    """The published entry of ``rel``'s current version (as a mount looks it up)."""
    path = os.path.join(str(src), rel)
    fmt = resolve_format(rel, [], {})
    key = cache_key(path, SourceStamp.of(os.stat(path)), fmt.name, fmt.params())
    f = IndexCache(shared)._file(key)
    assert f.exists(), f"no published entry for {rel}"
    return f


def forge(entry: Path, data: bytes, change: Callable[[np.ndarray, bytes], np.ndarray]) -> int:
    """Rewrite ``entry`` whole, with changed bounds and the checksum recomputed (it loads);
    returns its record count."""
    with np.load(entry) as z:
        bounds, meta = z["bounds"].copy(), json.loads(bytes(z["meta"]).decode())
    bounds = np.ascontiguousarray(change(bounds, data), "<i8")
    meta.pop("sum")
    meta["sum"] = _digest(bounds, meta)
    with open(entry, "wb") as out:
        np.savez(out, bounds=bounds, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    return len(bounds) - 1


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def eio_then_right(m, plain, rels: list[str], reason: str | tuple[str, ...], name: str) -> str:
    """Reading ``rels`` in turn, one is EIO (log and error attribute name the file ``name`` and
    why: ``reason``, or one of them); a new open of it reads what the plain mount reads.  Returns
    it."""
    reasons = (reason,) if isinstance(reason, str) else reason
    for rel in rels:
        try:
            m.path(rel).read_bytes()
        except OSError as e:
            assert e.errno == errno.EIO
            break
    else:
        raise AssertionError(f"no EIO from {rels}")
    why = os.getxattr(m.path(rel), ERROR).decode()
    assert "EIO" in why and name in why and any(r in why for r in reasons), why
    log = m.stderr()
    assert name in log and "at source offset" in log and any(r in log for r in reasons), log[-3000:]
    assert m.path(rel).read_bytes() == plain.path(rel).read_bytes()
    assert ERROR not in os.listxattr(m.path(rel))  # read right since
    return rel


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_published_index_is_eio_once_then_the_files_own(mount, tmp_path, forgery):
    """Holds: SEMANTICS.md#changes-framing, SEMANTICS.md#changes-published, SEMANTICS.md#errors-eio"""
    rel, change, reason = FORGERIES[forgery]
    src = write_tree(tmp_path / "src", FILES)
    shared = tmp_path / "shared"
    publish(src, shared)
    forged = forge(entry_of(shared, src, rel), FILES[rel], change)
    before = snapshot(shared)
    m = mount(None, *ARGS, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, *ARGS, src=src, name="plain")
    right = int(plain.xattr("records", rel))
    assert forged != right
    eio_then_right(m, plain, [rel], reason, rel)
    errors = m.stats()["errors"]
    assert int(m.xattr("records", rel)) == right
    assert "may be its published one" in m.stderr()
    for epoch in (1, 2):  # never the forged entry again: every epoch, every file, the plain bytes
        m.set_epoch(epoch)
        plain.set_epoch(epoch)
        for name in FILES:
            assert m.path(name).read_bytes() == plain.path(name).read_bytes(), (name, epoch)
    assert m.stats()["errors"] == errors  # none since
    assert len(list(m.cache.rglob("*.npz"))) == 1  # only the forged file was indexed here
    assert snapshot(shared) == before  # the shared directory is never written


def test_a_forged_member_of_a_pool_and_of_a_mixture(mount, tmp_path):
    """A pool's member and a mixture's file, each forged: EIO naming that file, then the shards
    of the mount without the forged entries (the pool's and the mixture's files indexed here).
    Holds: SEMANTICS.md#changes-framing, SEMANTICS.md#changes-published"""
    files = {**{f"pool/part-{k:05d}.jsonl": jsonl(900 + 50 * k, 20 + k) for k in range(3)},
             "web/w0.jsonl": jsonl(1200, 30), "web/w1.jsonl": jsonl(800, 31), "books/b.jsonl": jsonl(600, 32)}
    src = write_tree(tmp_path / "src", files)
    (tmp_path / "mix.toml").write_text('[[mix]]\nname = "blend"\nsamples = 2500\n'
                                       '[[mix.source]]\nglob = "web/*.jsonl"\nweight = 3\n'
                                       '[[mix.source]]\nglob = "books/*.jsonl"\nweight = 1\n')
    args = [*ARGS, "--config", str(tmp_path / "mix.toml")]
    shared = tmp_path / "shared"
    publish(src, shared)
    for rel in ("pool/part-00001.jsonl", "web/w1.jsonl"):
        forge(entry_of(shared, src, rel), files[rel], drop_every_second)
    m = mount(None, *args, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, *args, src=src, name="plain")
    shards = [f"pool/{s}" for s in sorted(os.listdir(plain.path("pool")))]
    eio_then_right(m, plain, shards, "a newline inside a line", "part-00001.jsonl")
    for s in shards:
        assert m.path(s).read_bytes() == plain.path(s).read_bytes()
    blend = [f".mix/blend/{s}" for s in sorted(os.listdir(plain.path(".mix/blend")))]
    eio_then_right(m, plain, blend, "a newline inside a line", "w1.jsonl")
    got = b"".join(m.path(s).read_bytes() for s in blend)
    assert got == b"".join(plain.path(s).read_bytes() for s in blend)
    assert sum(lines(got).values()) == 2500
    assert len(list(m.cache.rglob("*.npz"))) == 6  # the pool's files and the mixture's, no other


def test_a_resumed_epoch_over_a_forged_index(mount, tmp_path):
    """A resume after 1,000 records over an index of line pairs: EIO, then the rest of the
    epoch after 1,000 lines, as the mount without the forged entry serves it.
    Holds: SEMANTICS.md#changes-framing"""
    src = write_tree(tmp_path / "src", {"a.jsonl": FILES["a.jsonl"]})
    shared = tmp_path / "shared"
    publish(src, shared)
    forge(entry_of(shared, src, "a.jsonl"), FILES["a.jsonl"], drop_every_second)
    m = mount(None, *ARGS, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, *ARGS, src=src, name="plain")
    state = json.dumps({"epoch": 3, "views": {"a.jsonl": [{"world_size": 1, "parts": 1, "consumed": [[1000]]}]}})
    for x in (m, plain):
        os.setxattr(x.path(), "user.shufflefs.resume", state.encode())
    eio_then_right(m, plain, ["a.jsonl"], "a newline inside a line", "a.jsonl")
    assert sum(lines(m.path("a.jsonl").read_bytes()).values()) == 2000


@pytest.mark.parametrize("how", ["records end early", "a bound off the grid"])
def test_a_published_entry_that_fails_its_load_check_is_indexed_here_at_once(mount, tmp_path, how):
    """Not EIO, and not EIO on later opens either: the file is indexed here, the entry not taken
    again.  Holds: SEMANTICS.md#changes-published"""
    rel = "a.jsonl" if how == "records end early" else "e.tar"
    src = write_tree(tmp_path / "src", FILES)
    shared = tmp_path / "shared"
    publish(src, shared)
    change = (lambda b, d: b[:-1]) if rel == "a.jsonl" else (lambda b, d: np.concatenate((b[:5], b[5:6] + 7, b[6:])))
    forge(entry_of(shared, src, rel), FILES[rel], change)
    m = mount(None, *ARGS, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, *ARGS, src=src, name="plain")
    for epoch in range(3):
        m.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert m.path(rel).read_bytes() == plain.path(rel).read_bytes()
    assert m.stats()["errors"] == 0
    assert "may be its published one" in m.stderr()


# --------------------------------------------------------------------------- samples across windows

SPEC = ShuffleSpec(strategy="stratified", seed=5, block_size=8192, buffer=65536)
"""The order of a mount with `ARGS`."""
PLS = ["--strategy", "pls", "--exchange", "0.25", "--world-size", "2", "--rank", "1", "--pls-local", "uniform",
       "--block-size", "4KiB", "--buffer", "64KiB", "--seed", "5"]
PLS_SPEC = ShuffleSpec(strategy="pls", seed=5, block_size=4096, buffer=65536, exchange=0.25, pls_local="uniform")


def wds_bytes(n: int, stem: str = "s") -> bytes:
    """WebDataset samples of three members (jpg, cls, json), a directory before every 10th (no
    key: it goes with the sample after it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(n):
            if i % 10 == 4:
                d = tarfile.TarInfo(f"{stem}-d{i:06d}")
                d.type = tarfile.DIRTYPE
                t.addfile(d)
            for ext, data in (("jpg", b"image %d " % i * (i % 13 + 20)), ("cls", b"%d" % (i % 10)),
                              ("json", b'{"i": %d}' % i)):
                info = tarfile.TarInfo(f"{stem}-{i:06d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def scan(data: bytes) -> RecordIndex:
    return TarFormat().scan(np.frombuffer(data, np.uint8), "x.tar")


def cuts(data: bytes, block: int) -> list[int]:
    """Offsets of the last member of every sample that ends in another block than it starts:
    a bound there cuts the sample in two halves of different blocks."""
    b, offsets = scan(data).bounds, members_of(data)
    return [last for lo, hi in zip(b[:-1].tolist(), b[1:].tolist())
            for last in [max(o for o in offsets if lo <= o < hi)] if last // block != lo // block]


def cut_at(offset: int) -> Callable[[np.ndarray, bytes], np.ndarray]:
    return lambda bounds, data: np.sort(np.append(bounds, offset))


def dirs_moved(bounds: np.ndarray, data: bytes) -> np.ndarray:
    """Every directory that starts a sample moved to the sample before it (as many samples)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        members = t.getmembers()
    out = bounds.copy()
    for a, nxt in zip(members, members[1:]):
        at = np.flatnonzero(out == a.offset)
        if a.isdir() and len(at) and 0 < at[0] < len(out) - 1:
            out[at[0]] = nxt.offset
    return out


def read_until_eio(path: Path) -> tuple[bytes, bool]:
    """The bytes read front to back until EIO (then True) or the end."""
    got = bytearray()
    with open(path, "rb", buffering=0) as f:
        while True:
            try:
                chunk = f.read(1 << 16)
            except OSError as e:
                assert e.errno == errno.EIO, e
                return bytes(got), True
            if not chunk:
                return bytes(got), False
            got += chunk


def samples_of(data: bytes, whole: bool = True) -> list[list[str]]:
    """The keyed members' names of every sample in tar bytes, as a reader groups them
    (consecutive members of one key; a name seen again starts another sample: a repeat); of a
    cut stream (``whole`` false), those before its last sample."""
    out: list[list[str]] = []
    key, at = None, 0
    while at + 512 <= len(data) and any(data[at: at + 512]):
        h = data[at: at + 512]
        name, size = h[:100].split(b"\0")[0].decode(), int(h[124:136].split(b"\0")[0] or b"0", 8)
        end = at + 512 + (0 if h[156:157] == b"5" else -(-size // 512) * 512)
        if end > len(data):
            break
        base = name.rsplit("/", 1)[-1]
        if h[156:157] in (b"0", b"\0") and "." in base[1:]:
            k = name[: len(name) - len(base) + base.index(".", 1)]
            if k != key or name in out[-1]:
                out.append([])
            out[-1].append(name)
            key = k
        at = end
    return out if whole else out[:-1]


def served_whole(m, rels: list[str], source: dict[str, bytes], reason: str) -> tuple[str, bytes]:
    """Reading ``rels`` in turn until one is EIO (naming ``reason``): every sample served before
    (each read whole, and the part of the EIO's read) is a whole sample of a source file.
    Returns the file that was EIO and what it served before."""
    truth = {tuple(s) for data in source.values() for s in samples_of(data)}
    for rel in rels:
        got, eio = read_until_eio(m.path(rel))
        served = samples_of(got, whole=not eio)
        assert all(tuple(s) in truth for s in served), [s for s in served if tuple(s) not in truth][:3]
        if eio:
            why = os.getxattr(m.path(rel), ERROR).decode()
            assert "EIO" in why and reason in why, why
            return rel, got
    raise AssertionError(f"no EIO from {rels}: served without a check")


def window_of(plan, rid: int) -> int:
    return next(k for k in range(plan.n_windows) if rid in set(plan.window(k).tolist()))


def forged_halves(data: bytes, block: int, fits: Callable[[RecordIndex, int], bool]) -> int:
    """The first cut (`cuts`) for which ``fits(forged index, first half's id)``."""
    for cut in cuts(data, block):
        bounds = cut_at(cut)(scan(data).bounds, data)
        if fits(RecordIndex(len(data), bounds), int(np.searchsorted(bounds, cut)) - 1):
            return cut
    raise AssertionError("no cut fits")


FORGED_TAR = {"cut": (None, "same sample key"), "moved": (dirs_moved, "members of no sample key")}


@pytest.mark.parametrize("forgery", sorted(FORGED_TAR))
def test_a_forged_tar_index_is_eio_before_any_wrong_sample_is_served(mount, tmp_path, forgery):
    """The halves in different windows, the second served first: the first window holding either
    is EIO; a directory moved to the sample before it: EIO, the bytes before it those of the
    mount without the forged entry.  Then the file's own index, as many records.
    Holds: SEMANTICS.md#changes-framing-tar, SEMANTICS.md#changes-published"""
    files = {"w.tar": wds_bytes(300)}
    change, reason = FORGED_TAR[forgery]
    if change is None:
        def later(index: RecordIndex, first: int) -> bool:  # the second half's window comes first
            plan = make_plan(index, SPEC, 0)
            return window_of(plan, first + 1) < window_of(plan, first)
        change = cut_at(forged_halves(files["w.tar"], 8192, later))
    src = write_tree(tmp_path / "src", files)
    shared = tmp_path / "shared"
    publish(src, shared)
    forged = forge(entry_of(shared, src, "w.tar"), files["w.tar"], change)
    m = mount(None, *ARGS, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, *ARGS, src=src, name="plain")
    want = plain.path("w.tar").read_bytes()
    index = scan(files["w.tar"])
    assert want == render(index, make_plan(index, SPEC, 0), files["w.tar"])  # SPEC is the mount's order
    assert (forged != index.n) == (forgery == "cut")
    _, got = served_whole(m, ["w.tar"], files, reason)
    if forgery == "moved":  # the same order: the bytes before the EIO are the plain view's
        assert got == want[: len(got)]
    assert m.path("w.tar").read_bytes() == want
    assert int(m.xattr("records", "w.tar")) == index.n
    assert "may be its published one" in m.stderr()


@pytest.mark.parametrize("forgery", sorted(FORGED_TAR))
def test_a_forged_tar_index_under_a_stage(mount, tmp_path, forgery):
    """``--stage-dir``: the rank's stage holds one half of a cut sample, the other half being
    another rank's (or a moved directory's sample): EIO, then the file's own index.
    Holds: SEMANTICS.md#changes-framing-tar, SEMANTICS.md#changes-published"""
    files = {"w.tar": wds_bytes(300)}
    change, reason = FORGED_TAR[forgery]
    if change is None:
        def apart(index: RecordIndex, first: int) -> bool:  # one half in the rank's partition
            held = set(pls_exchange(index.body(), PLS_SPEC, 2).partition(1, 0).tolist())
            return (first in held) != (first + 1 in held)
        change = cut_at(forged_halves(files["w.tar"], 4096, apart))
    src = write_tree(tmp_path / "src", files)
    shared = tmp_path / "shared"
    publish(src, shared)
    forge(entry_of(shared, src, "w.tar"), files["w.tar"], change)
    m = mount(None, *PLS, "--index-dir", str(shared), "--stage-dir", str(tmp_path / "stage"), src=src,
              name="published")
    plain = mount(None, *PLS, src=src, name="plain")
    served_whole(m, ["w.tar"], files, reason)
    for epoch in (0, 1):
        m.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert m.path("w.tar").read_bytes() == plain.path("w.tar").read_bytes()
    assert m.stats()["staging"]["built"] >= 2


@pytest.mark.parametrize("forgery", sorted(FORGED_TAR))
@pytest.mark.parametrize("strategy", ["full", "stratified"])
def test_a_forged_tar_index_in_a_mixture(mount, tmp_path, forgery, strategy):
    """A mixture of tar files, one file's index forged: its halves are taken in stretches of
    their own (``full``: a record each) or end one (``stratified``: blocks): EIO, every sample
    before it whole, then the shards of the mount without the forged entry.
    Holds: SEMANTICS.md#changes-framing-tar, SEMANTICS.md#changes-published"""
    files = {"web/w0.tar": wds_bytes(120, "w0"), "web/w1.tar": wds_bytes(150, "w1"),
             "books/b.tar": wds_bytes(100, "b")}
    change, reason = FORGED_TAR[forgery]
    if change is None:
        change = cut_at(cuts(files["web/w1.tar"], 8192)[5])
    src = write_tree(tmp_path / "src", files)
    (tmp_path / "mix.toml").write_text('[[mix]]\nname = "blend"\nsamples = 900\n'
                                       '[[mix.source]]\nglob = "web/*.tar"\nweight = 3\n'
                                       '[[mix.source]]\nglob = "books/*.tar"\nweight = 1\n')
    args = [*ARGS, "--strategy", strategy, "--config", str(tmp_path / "mix.toml")]
    shared = tmp_path / "shared"
    publish(src, shared)
    forge(entry_of(shared, src, "web/w1.tar"), files["web/w1.tar"], change)
    m = mount(None, *args, "--index-dir", str(shared), src=src, name="published")
    plain = mount(None, *args, src=src, name="plain")
    blend = [f".mix/blend/{s}" for s in sorted(os.listdir(plain.path(".mix/blend")))]
    served_whole(m, blend, files, reason)
    got = [m.path(s).read_bytes() for s in blend]
    assert got == [plain.path(s).read_bytes() for s in blend]
    assert sum(len(samples_of(g)) for g in got) == 900
