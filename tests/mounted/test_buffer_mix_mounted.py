"""Level: mounted (real FUSE mounts).

A buffer holding few blocks of a label-sorted file: the view's info attribute and ``shufflefs
stat`` give the blocks per buffer and the expected label mix of a buffer (the info also the mix
the view's order really gives), and the daemon logs a warning naming the file and what to set; a
buffer of many blocks gets no warning."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import numpy as np

from shufflefs.quality.metrics import expected_block_mix_tv, label_mix_tv
from shufflefs.strategies.base import MIX_ASSUMPTION

# 100,000 records of 40 bytes (4 MB, 62 blocks of 64 KiB), sorted by 10 labels
SORTED = b"".join(b'{"label": %d, "i": %010d, "p": "x"}\n' % (i // 10_000, i) for i in range(100_000))


def labels_read(path) -> np.ndarray:
    with open(path, "rb") as f:  # the lines' zero-padded numbers are no JSON: the label by its place
        return np.array([int(line[len(b'{"label": '):].split(b",", 1)[0]) for line in f], np.int64)


def stat_text(mnt) -> str:
    r = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(mnt)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("strategy", ["corgipile", "block"])
def test_a_buffer_of_16_blocks_is_reported(mount, strategy):
    assert len(SORTED.splitlines()[0]) + 1 == 40
    m = mount({"sorted.jsonl": SORTED}, "--strategy", strategy, "--block-size", "64KiB", "--buffer", "1MiB")
    info = json.loads(m.xattr("info", "sorted.jsonl"))
    mix = round(expected_block_mix_tv(16, 10), 3)
    assert info["blocks_per_buffer"] == 16 and info["blocks_per_window"] == 16
    assert info["buffer_label_mix"] == mix and info["buffer_label_mix_for"] == MIX_ASSUMPTION
    # what the order gives: corgipile's buffers about that mix; block's view is runs of whole blocks
    got = labels_read(m.path("sorted.jsonl"))
    assert info["expected_label_mix"] == round(label_mix_tv(np.arange(len(got)), got, 1000), 3)
    assert info["expected_label_mix"] > (0.8 if strategy == "block" else 0.15), info
    assert m.stats()["small_buffers"] == {"sorted.jsonl": {"blocks_per_buffer": 16, "expected_label_mix": mix}}
    log = m.stderr()
    warned = [line for line in log.splitlines() if "sorted.jsonl: a buffer holds 16 blocks" in line]
    assert len(warned) == 1, log
    assert "WARNING" in warned[0] or "warning" in warned[0].lower(), warned[0]
    assert f"{mix:.3f}" in warned[0] and "--block-size smaller or --buffer larger" in warned[0]
    out = stat_text(m.mnt)
    assert f"sorted.jsonl: 16 blocks per buffer, expected label mix {mix}" in out, out


def test_a_buffer_of_256_blocks_is_not_warned_about(mount):

    m = mount({"sorted.jsonl": SORTED}, "--strategy", "corgipile", "--block-size", "4KiB", "--buffer", "1MiB")
    open(m.path("sorted.jsonl"), "rb").read()
    info = json.loads(m.xattr("info", "sorted.jsonl"))
    assert info["blocks_per_buffer"] == 256
    assert info["buffer_label_mix"] == round(expected_block_mix_tv(256, 10), 3)
    assert m.stats()["small_buffers"] == {}
    assert "a buffer holds" not in m.stderr()
    assert "small buffer" not in stat_text(m.mnt)
