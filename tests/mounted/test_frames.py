"""Level: mounted (real FUSE mounts, real readers).

TFRecord frames are checked as every window is gathered, not only when the index is built: a
payload byte that changed unseen (here: bytes changed and an index of the old bytes planted in
the cache under the new version's key) is EIO naming the file, never served; ``--verify index``
turns the check off."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from shufflefs.errors import FormatError
from shufflefs.formats import resolve_format
from shufflefs.formats.tfrecord import check_frames, encode_frame
from shufflefs.index.table import IndexCache, RecordIndex, SourceStamp, cache_key

FRAMES = [encode_frame(b"payload-%05d-" % i + b"x" * (i % 50)) for i in range(3000)]
DATA = b"".join(FRAMES)
ARGS = ["--block-size", "8KiB", "--buffer", "32KiB"]


def flip_and_plant(src: Path, cache: Path, at: int) -> None:
    """Flip the byte at ``at`` and give the new version the old version's cached index (a whole
    entry, written for the new version: only the window check can tell)."""
    path = src / "a.tfrecord"
    fmt = resolve_format("a.tfrecord", [], {})
    old = SourceStamp.of(os.stat(path))
    store = IndexCache(cache)
    index = store.load(cache_key(path, old, fmt.name, fmt.params()), old)
    assert index is not None
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(old.mtime_ns, old.mtime_ns))
    new = SourceStamp.of(os.stat(path))
    store.store(cache_key(path, new, fmt.name, fmt.params()), RecordIndex(index.size, index.bounds, False, new))


@pytest.mark.parametrize("where", ["payload", "data crc", "length crc"])
def test_a_frame_changed_after_indexing_is_eio_not_served(mount, where):
    m = mount({"a.tfrecord": DATA}, *ARGS)
    assert sorted(open(m.path("a.tfrecord"), "rb").read()) == sorted(DATA)  # indexed and cached
    m.stop()
    frame = 1234
    start = sum(len(f) for f in FRAMES[:frame])
    at = {"payload": start + 14, "data crc": start + len(FRAMES[frame]) - 2, "length crc": start + 9}[where]
    flip_and_plant(m.src, m.cache, at)
    again = mount(None, *ARGS, "--cache-dir", str(m.cache), src=m.src, name="again")
    with pytest.raises(OSError) as e:
        open(again.path("a.tfrecord"), "rb").read()
    assert e.value.errno == errno.EIO
    assert "a.tfrecord" in again.stderr() and "record 1234" in again.stderr()
    assert again.stats()["errors"] >= 1


def test_verify_index_serves_without_the_window_check(mount):
    m = mount({"a.tfrecord": DATA}, *ARGS)
    open(m.path("a.tfrecord"), "rb").read()
    m.stop()
    flip_and_plant(m.src, m.cache, sum(len(f) for f in FRAMES[:10]) + 14)
    again = mount(None, *ARGS, "--verify", "index", "--cache-dir", str(m.cache), src=m.src, name="again")
    assert len(open(again.path("a.tfrecord"), "rb").read()) == len(DATA)


def test_check_frames_finds_every_kind_of_damage_in_a_window():
    fmt = resolve_format("a.tfrecord", [], {})
    index = fmt.scan(np.frombuffer(DATA, np.uint8), "a.tfrecord")
    ids = np.random.default_rng(0).permutation(index.n)[:500]
    window = np.concatenate([np.frombuffer(FRAMES[i], np.uint8) for i in ids])
    check_frames(window, ids, index, "a.tfrecord")  # intact: no error
    for at in (0, 9, 13, len(FRAMES[ids[0]]) - 1):
        bad = window.copy()
        bad[at] ^= 1
        with pytest.raises(FormatError) as e:
            check_frames(bad, ids, index, "a.tfrecord")
        assert e.value.offset == int(index.bounds[ids[0]])
