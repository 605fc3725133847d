"""Level: mounted (real FUSE mounts, real readers).

How views are served: through the page cache, or with ``direct_io`` for a JSON lines, text,
TFRecord or tar view whose windows do not keep their source's pages (``--source-cache`` chose or
was told ``drop`` or ``direct``, as for a file that does not fit the page cache).  Either way
``read()`` gives the same bytes; a shared mapping of a ``direct_io`` view fails with ENODEV, a
private one works; CSV and ``.npy`` views stay mappable; ``--page-cache`` keeps every view in the
page cache; ``shufflefs stat`` counts the opens served each way."""

from __future__ import annotations

import errno
import io
import mmap
import subprocess
import sys

import numpy as np
import pytest

ARGS = ["--block-size", "16KiB", "--buffer", "64KiB", "--seed", "4"]
LINES = b"".join(b'{"id": %05d, "label": %d}\n' % (i, i // 400) for i in range(4000))
CSV = b"id,label\n" + b"".join(b"%d,%d\n" % (i, i // 400) for i in range(4000))


def npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(4000 * 4, dtype=np.int64).reshape(4000, 4))
    return buf.getvalue()


FILES = {"a.jsonl": LINES, "t.txt": LINES, "r.csv": CSV, "n.npy": npy()}


def shared_map(path) -> bytes | int:
    """The bytes of a shared read-only mapping of ``path``, or the errno mmap failed with."""
    with open(path, "rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return bytes(m)
        except OSError as e:
            return e.errno


def private_map(path) -> bytes:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
        return bytes(m)


@pytest.mark.parametrize("source_cache", ["drop", "direct"])
def test_a_view_whose_source_does_not_stay_cached_is_served_direct(mount, source_cache: str):
    """Holds: SEMANTICS.md#views-pagecache, SEMANTICS.md#errors-enodev, SEMANTICS.md#views-source-cache"""
    auto = mount(FILES, *ARGS, "--source-cache", source_cache, name="auto")
    cached = mount(FILES, *ARGS, "--source-cache", source_cache, "--page-cache", name="cached")
    for name in ("a.jsonl", "t.txt"):
        got = auto.path(name).read_bytes()
        assert got == cached.path(name).read_bytes() and sorted(got.splitlines()) == sorted(LINES.splitlines())
        assert shared_map(auto.path(name)) == errno.ENODEV  # direct_io: no shared mapping
        assert private_map(auto.path(name)) == got
        assert shared_map(cached.path(name)) == got
    for name in ("r.csv", "n.npy"):  # mapped by their readers: always the page cache
        assert shared_map(auto.path(name)) == auto.path(name).read_bytes() == cached.path(name).read_bytes()
    serving = auto.stats()["serving"]
    assert serving.get("direct_io: its source does not stay cached", 0) >= 6, serving
    assert serving.get("page cache: mapped by its readers", 0) >= 1 and serving.get("page cache", 0) >= 1, serving
    assert set(cached.stats()["serving"]) <= {"page cache: --page-cache", "page cache: mapped by its readers"}
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(auto.path())], capture_output=True,
                         text=True, timeout=60).stdout
    assert "serving" in out and "direct_io: its source does not stay cached" in out


def test_views_of_files_that_fit_stay_in_the_page_cache(mount):
    """Holds: SEMANTICS.md#views-pagecache"""
    m = mount(FILES, *ARGS)
    for name in FILES:
        assert shared_map(m.path(name)) == m.path(name).read_bytes()
    assert not any(why.startswith("direct_io") for why in m.stats()["serving"])


def test_direct_io_and_page_cache_exclude_each_other(tmp_path):
    """Holds: SEMANTICS.md#views-pagecache"""
    (tmp_path / "src").mkdir()
    (tmp_path / "mnt").mkdir()
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(tmp_path / "src"), str(tmp_path / "mnt"),
                        "--direct-io", "--page-cache", "--cache-dir", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--direct-io and --page-cache" in r.stderr, r.stderr
