"""Level: mounted (real FUSE mounts).

Compressed files that are damaged, rewritten while mounted, or whose codec's library is missing:
a stream that does not decode (or whose CRC fails) is EIO with the file and the offset in the log
and in ``user.shufflefs.error``, never bytes; a file rewritten under an open handle is ESTALE for
that handle and the new version for the next open, also when it is read from a decoded copy; a
compressed file whose library is missing passes through unchanged."""

from __future__ import annotations

import collections
import errno
import gzip
import json
import os
import time
from pathlib import Path

import pytest

import compressed_files as cf


def read_error(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            f.read()
    except OSError as e:
        return e.errno
    return 0


@pytest.mark.parametrize("name, encode", [
    ("bad.jsonl.gz", lambda d: cf.gz(d)),
    ("bad.jsonl.zst", lambda d: cf.zst(d, frame=1 << 20)),
    ("bad.csv.zst", lambda d: cf.zst(d)),
])
def test_a_damaged_stream_is_eio_naming_the_file_and_offset(mount, name: str, encode):
    """Holds: SEMANTICS.md#errors-eio, SEMANTICS.md#errors-reason, SEMANTICS.md#views-compressed"""
    plain = cf.csv_text(3000) if "csv" in name else cf.jsonl(3000)
    data = bytearray(encode(plain))
    data[len(data) // 2] ^= 0x20  # a byte in the middle of the stream
    m = mount({name: bytes(data), "good.jsonl.gz": cf.gz(cf.jsonl(500))})
    assert read_error(m.path(name)) == errno.EIO
    reason = m.xattr("error", name)
    assert "EIO" in reason and name in reason and "source offset" in reason, reason
    assert name in m.stderr() and "source offset" in m.stderr()
    assert os.stat(m.path(name)).st_size == 0  # the name stays, so that its reason is readable
    with gzip.open(m.path("good.jsonl.gz")) as f:  # the mount serves every other file
        assert len(f.readlines()) == 500


@pytest.mark.parametrize("name, encode", [
    ("data.jsonl.gz", lambda d: cf.gz(d)),
    ("data.jsonl.zst", lambda d: cf.zst(d)),  # one frame of 6 MB: read from a decoded copy
])
def test_a_rewrite_is_estale_for_open_handles_and_the_new_version_for_new_opens(mount, name: str, encode):
    """Holds: SEMANTICS.md#changes-open-estale, SEMANTICS.md#changes-new-open, SEMANTICS.md#views-compressed-copy"""
    old, new = cf.jsonl(9000, seed=1), cf.jsonl(8000, seed=2)
    m = mount({name: encode(old)})
    src = m.src / name
    with open(m.path(name), "rb") as f:
        head = f.read(100_000)
        assert len(head) == 100_000
        tmp = src.with_suffix(".tmp")
        tmp.write_bytes(encode(new))
        os.replace(tmp, src)  # a new version by rename, as writers publish files
        with pytest.raises(OSError) as e:
            f.read()
        assert e.value.errno == errno.ESTALE
    deadline = time.monotonic() + 5
    while True:  # the kernel may keep the old name's attributes for a second
        try:
            got = cf.decode(name, m.path(name).read_bytes())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert collections.Counter(cf.lines_of(got)) == collections.Counter(cf.lines_of(new))
    info = json.loads(m.xattr("info", name))["compressed"]
    assert info["decoded_bytes"] == len(new)
    if name.endswith(".zst"):
        assert info["read_from"] == "a decoded copy"
        copies = m.stats()["decoded_copies"]
        assert len(copies) == 1 and next(iter(copies.values()))["bytes"] == len(new)  # the old copy went


def test_without_the_codecs_library_its_files_pass_through(mount, monkeypatch, tmp_path):
    """Holds: SEMANTICS.md#views-compressed, SEMANTICS.md#tree-views"""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "rapidgzip.py").write_text("raise ImportError('rapidgzip is not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", str(shim) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    lines = cf.jsonl(2000)
    m = mount({"a.jsonl.gz": cf.gz(lines), "a.jsonl.zst": cf.zst(lines, frame=1 << 19), "a.jsonl": lines})
    assert m.path("a.jsonl.gz").read_bytes() == (m.src / "a.jsonl.gz").read_bytes()  # unchanged
    with pytest.raises(OSError):
        os.getxattr(m.path("a.jsonl.gz"), "user.shufflefs.info")
    assert "pass through unchanged: rapidgzip is not installed" in m.stderr()
    assert json.loads(m.xattr("info", "a.jsonl.zst"))["format"] == "lines-zstd"  # zstd is there
    assert cf.decode("a.zst", m.path("a.jsonl.zst").read_bytes()) != lines


def test_a_gzip_file_cut_inside_its_data_is_eio_not_the_bytes_before_the_cut(mount):
    """rapidgzip 0.16 may end a stream cut inside its deflate data without an error, with the
    records before the cut: a download cut short was served as a shorter file.  The scan checks
    that decoding reached the stream's end.  Holds: SEMANTICS.md#errors-eio, SEMANTICS.md#views-compressed"""
    whole = cf.gz(cf.jsonl(3000))
    m = mount({"cut.jsonl.gz": whole[: len(whole) - 5000], "good.jsonl.gz": whole})
    assert read_error(m.path("cut.jsonl.gz")) == errno.EIO
    reason = m.xattr("error", "cut.jsonl.gz")
    assert "truncated gzip stream" in reason and "cut.jsonl.gz" in reason, reason
    with gzip.open(m.path("good.jsonl.gz")) as f:
        assert len(f.readlines()) == 3000
