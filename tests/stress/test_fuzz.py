"""Level: stress (a short run by default, the long one with ``--stress``).

Mounted fuzzing: damaged files of every format under every strategy, read by ``cat`` and by
random preads.  A read passes if it gives bytes of a correct permutation of the damaged file's
records (as an independent split of that file finds them) or an errno; any other bytes fail.
Hypothesis draws the damage (truncation, flipped bytes, appended garbage, emptied files); the
default run draws a few trees, ``--stress`` many more."""

from __future__ import annotations

import collections
import io
import os
import struct
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Mounter
from shufflefs.formats.tfrecord import encode_frame, masked_crc

STRATEGIES = ["none", "once", "full", "lirs-page", "block", "corgipile", "window", "pls"]
HEADER, RECORD = 16, 8


def sources(seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    lines = b"".join(b'{"i": %d, "t": "%s"}\n' % (i, b"z" * int(rng.integers(0, 30))) for i in range(800))
    csv = b"a,b\n" + b"".join(b'%d,"x\n%d"\n' % (i, i) for i in range(300))
    buf = io.BytesIO()
    np.save(buf, np.arange(900, dtype=np.int32).reshape(300, 3))
    frames = b"".join(encode_frame(b"p%d" % i * int(rng.integers(1, 9))) for i in range(300))
    fixed = bytes(range(HEADER)) + rng.integers(0, 256, 400 * RECORD, dtype=np.uint8).tobytes()
    shards = io.BytesIO()
    with tarfile.open(fileobj=shards, mode="w", format=tarfile.GNU_FORMAT) as t:
        for i in range(120):
            for suffix in ("jpg", "cls"):
                data = b"%d" % i * int(rng.integers(0, 90)) if suffix == "jpg" else b"%d" % (i % 3)
                info = tarfile.TarInfo(f"{'k' * (i % 2) * 120}/{i:05d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return {"a.jsonl": lines, "b.csv": csv, "c.npy": buf.getvalue(), "d.tfrecord": frames, "e.bin": fixed,
            "f.tsv": b"h\tk\n" + lines.replace(b", ", b"\t"), "g.tar": shards.getvalue()}


damage = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 1.0)),
    st.tuples(st.just("flip"), st.lists(st.floats(0.0, 0.9999), min_size=1, max_size=4)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("empty"), st.none()),
    st.tuples(st.just("none"), st.none()),
)


def damaged(data: bytes, how: tuple) -> bytes:
    kind, arg = how
    if kind == "truncate":
        return data[: int(arg * len(data))]
    if kind == "flip":
        b = bytearray(data)
        for f in arg:
            b[int(f * len(b))] ^= 0x5A
        return bytes(b)
    if kind == "append":
        return data + arg
    if kind == "empty":
        return b""
    return data


# ----------------------------------------------------------------------------- oracles


def line_records(data: bytes, header_lines: int = 0) -> tuple[bytes, list[bytes]]:
    lines = data.splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    return b"".join(lines[:header_lines]), lines[header_lines:]


def tfrecord_records(data: bytes) -> list[bytes] | None:
    """The frames, or None if the file is not a valid TFRecord file."""
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < 12:
            return None
        (length,) = struct.unpack_from("<Q", data, pos)
        if masked_crc(data[pos: pos + 8]) != struct.unpack_from("<I", data, pos + 8)[0]:
            return None
        end = pos + 16 + length
        if end > len(data) or masked_crc(data[pos + 12: end - 4]) != struct.unpack_from("<I", data, end - 4)[0]:
            return None
        out.append(data[pos:end])
        pos = end
    return out


def tar_members(data: bytes) -> list[tuple[str, bytes]] | None:
    """The regular members as ``tarfile`` reads them, or None if it cannot."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as t:
            return [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isreg()]
    except (tarfile.TarError, OSError, EOFError):
        return None


def view_ok(name: str, source: bytes, view: bytes, share: bool) -> bool:
    """Whether ``view`` is a correct view (a rank's share if ``share``) of ``source``."""
    def same(got: list[bytes], want: list[bytes]) -> bool:
        g, w = collections.Counter(got), collections.Counter(want)
        return not (g - w) if share else g == w

    if name.endswith(".jsonl"):
        return same(line_records(view)[1], line_records(source)[1])
    if name.endswith(".tsv"):
        (vh, vr), (sh, sr) = line_records(view, 1), line_records(source, 1)
        return vh == sh and same(vr, sr)
    if name.endswith(".tfrecord"):
        want, got = tfrecord_records(source), tfrecord_records(view)
        return want is not None and got is not None and same(got, want)
    if name.endswith(".tar"):
        if not source:
            return view == b""
        want, got = tar_members(source), tar_members(view)
        return want is not None and got is not None and same(got, want)
    if name.endswith(".bin"):
        if len(source) == 0:
            return view == b""
        if len(source) < HEADER or (len(source) - HEADER) % RECORD:
            return False
        cut = lambda d: [d[i: i + RECORD] for i in range(HEADER, len(d), RECORD)]  # noqa: E731
        return view[:HEADER] == source[:HEADER] and same(cut(view), cut(source))
    # csv, npy: no independent record split here; the bytes must be the source's bytes
    v, s = np.bincount(np.frombuffer(view, np.uint8), minlength=256), np.bincount(np.frombuffer(source, np.uint8), minlength=256)
    return bool((v <= s).all()) if share else bool((v == s).all())


def check_tree(m, files: dict[str, bytes], share: bool, rng: np.random.Generator) -> list[str]:
    problems = []
    for name, source in files.items():
        path = m.path(name)
        r = subprocess.run(["cat", str(path)], capture_output=True, timeout=60)
        if r.returncode == 0 and not view_ok(name, source, r.stdout, share):
            problems.append(f"{name}: cat read wrong bytes ({len(r.stdout)} of {len(source)})")
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            for _ in range(12):
                off = int(rng.integers(0, max(size, 1)))
                n = int(rng.integers(1, 70000))
                try:
                    got = os.pread(fd, n, off)
                except OSError:
                    continue
                known = r.stdout[off: off + n]  # what cat got there (all of it if cat succeeded)
                if r.returncode == 0 and got != known:
                    problems.append(f"{name}: pread at {off} differs from cat's bytes")
                elif r.returncode != 0 and len(known) == len(got) and got != known:
                    problems.append(f"{name}: pread at {off} differs from the bytes cat got before its error")
        finally:
            os.close(fd)
    return problems


@given(seed=st.integers(0, 2**16), hows=st.lists(damage, min_size=6, max_size=6))
def fuzz_once(seed: int, hows: list[tuple]) -> None:
    files = {name: damaged(data, how) for (name, data), how in zip(sources(seed).items(), hows)}
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        mounter = Mounter(Path(tmp))
        try:
            problems = []
            for strategy in STRATEGIES:
                args = ["--strategy", strategy, "--block-size", "4KiB", "--buffer", "16KiB",
                        "--record-size", str(RECORD), "--header-bytes", str(HEADER), "--no-pool"]
                if strategy == "pls":
                    args += ["--world-size", "2", "--rank", "1", "--exchange", "0.3"]
                m = mounter(files, *args, name=strategy)
                problems += [f"{strategy}: {p}" for p in check_tree(m, files, strategy == "pls", rng)]
                m.stop()
            assert not problems, problems[:5]
        finally:
            mounter.stop_all()


def test_damaged_files_give_correct_bytes_or_an_errno(stress):
    settings(max_examples=25 if stress else 3, deadline=None, derandomize=not stress,
             suppress_health_check=list(HealthCheck))(fuzz_once)()
