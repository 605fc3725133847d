"""Level: mounted (real FUSE mounts, read by a plain JSON lines loop).

The default order of a label-sorted file larger than the buffer: stratified buffers of automatic
128 KiB blocks mix the labels like a uniform shuffle (within 2x by the 1,000-record label-mix
measure), where the former default (CorgiPile with 4 MiB blocks, 16 per buffer) was 8x off; and
the floor of the automatic block size taken from ``shufflefs advise``'s saved measurement of the
source's device, except with several ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from shufflefs.advise.cache import save
from shufflefs.quality.metrics import label_mix_tv

RECORDS, LABELS = 160_000, 10
PAD = b"x" * 980


def sorted_lines() -> bytes:
    """160,000 JSON lines of ~1 KB (160 MB, 2.4 default buffers), sorted by label."""
    return b"".join(b'{"label": %d, "i": "%07d", "p": "%s"}\n' % (i * LABELS // RECORDS, i, PAD)
                    for i in range(RECORDS))


def labels_read(path) -> np.ndarray:
    with open(path, "rb") as f:
        return np.array([json.loads(line)["label"] for line in f], np.int64)


def mix_of(labels: np.ndarray) -> float:
    return label_mix_tv(np.arange(len(labels)), labels, 1000)


def test_the_default_view_of_a_sorted_file_mixes_within_2x_of_a_uniform_shuffle(mount):
    m = mount({"train.jsonl": sorted_lines()})
    got = labels_read(m.path("train.jsonl"))
    assert len(got) == RECORDS and np.array_equal(np.bincount(got), np.full(LABELS, RECORDS // LABELS))
    info = json.loads(m.xattr("info", "train.jsonl"))
    assert info["strategy"] == "stratified" and info["block_size"] == 128 << 10 and info["block_size_auto"]
    assert info["blocks_per_buffer"] == 512 and info["windows"] == 3
    source = np.repeat(np.arange(LABELS), RECORDS // LABELS)
    uniform = mix_of(source[np.random.default_rng(0).permutation(RECORDS)])
    assert mix_of(got) <= 2 * uniform, (mix_of(got), uniform)
    assert info["buffer_label_mix"] < 0.02  # a buffer of 512 blocks
    assert info["expected_label_mix"] == round(mix_of(got), 3), (info, mix_of(got))  # what the view gives
    assert info["expected_label_mix_runs"] < 2 * info["uniform_label_mix"]

    old = mount({"train.jsonl": sorted_lines()}, "--strategy", "corgipile", "--block-size", "4MiB")
    assert mix_of(labels_read(old.path("train.jsonl"))) > 4 * uniform  # 16 blocks per buffer
    same_io = mount({"train.jsonl": sorted_lines()}, "--strategy", "corgipile")  # 512 blocks of 128 KiB
    assert mix_of(got) < mix_of(labels_read(same_io.path("train.jsonl")))


def stat_text(mnt) -> str:
    r = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(mnt)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


def saved_probe(directory, source) -> None:
    """A measurement of ``source``'s device where 256 KiB blocks and larger reach 90% of sequential."""
    rows = [{"block_size": b, "views_fraction": f, "views_mb_s": 1000 * f, "qd1_fraction": f / 2,
             "qd1_mb_s": 500 * f} for b, f in [(64 << 10, 0.5), (128 << 10, 0.7), (256 << 10, 0.95),
                                                (512 << 10, 0.97), (1 << 20, 1.0)]]
    save(source, {"date": "2026-11-25T00:00:00+00:00", "table": rows, "floor": 256 << 10}, directory)


def test_a_saved_measurement_of_the_device_sets_the_floor_of_automatic_blocks(mount, tmp_path):
    files = {"a.jsonl": sorted_lines()[: 40 << 20]}
    cache = tmp_path / "measured"  # a later --cache-dir wins over the fixture's own
    saved_probe(cache / "advise", tmp_path)
    m = mount(files, "--cache-dir", str(cache))
    info = json.loads(m.xattr("info", "a.jsonl"))
    assert info["block_size"] == 256 << 10, info
    out = stat_text(m.mnt)
    assert "block floor" in out and "as 'shufflefs advise' measured this device" in out, out
    assert "automatic blocks are at least 256 KiB" in out

    ranks = mount(files, "--cache-dir", str(cache), "--world-size", "2", "--rank", "0")
    assert json.loads(ranks.xattr("info", "a.jsonl"))["block_size"] == 128 << 10  # every rank alike
    assert "not used with --world-size 2" in stat_text(ranks.mnt)

    given = mount(files, "--cache-dir", str(cache), "--block-size", "64KiB")
    assert json.loads(given.xattr("info", "a.jsonl"))["block_size"] == 64 << 10
    assert "block floor" not in stat_text(given.mnt)

    plain = mount(files)  # no measurement saved in its cache directory
    assert json.loads(plain.xattr("info", "a.jsonl"))["block_size"] == 128 << 10
    assert "the default (128 KiB): no measurement of the device" in stat_text(plain.mnt)
