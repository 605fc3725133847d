"""Level: mounted (real FUSE mounts, real readers).

Staging through real mounts (``--stage-dir``): a staged rank serves the same bytes as an
unstaged one, and from epoch 1 on reads from the source only the records it received."""

from __future__ import annotations

import collections
import errno
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO
from test_mount import error_after_appending, jsonl, lines, read

from shufflefs.formats import make_format
from shufflefs.index.table import RecordIndex
from shufflefs.index.joined_index import PooledIndex
from shufflefs.strategies import ShuffleSpec
from shufflefs.strategies.partial_local import pls_exchange

Q, WORLD, RANK, BLOCK, SEED = 0.25, 2, 1, 4096, 5
ARGS = ["--strategy", "pls", "--exchange", str(Q), "--world-size", str(WORLD), "--rank", str(RANK),
        "--block-size", str(BLOCK), "--buffer", "64KiB", "--seed", str(SEED)]
SHARDS = [f"d/part-{i:05d}.jsonl" for i in range(3)]
FILES = {"a.jsonl": jsonl(2500, 1, 120)[:-1], **{s: jsonl(700 + 100 * i, 10 + i, 80) for i, s in enumerate(SHARDS)}}
FMT = make_format("lines", {})


def index_of(data: bytes) -> RecordIndex:
    return FMT.scan(np.frombuffer(data, np.uint8), "x")


def partition_bytes(index: RecordIndex, local: str, epoch: int) -> tuple[int, int]:
    """(bytes of the rank's partition, bytes of the records it received since epoch - 1); a torn
    last line is no partition's: the last rank stages it too (`torn_bytes`)."""
    spec = ShuffleSpec(strategy="pls", seed=SEED, block_size=BLOCK, exchange=Q, pls_local=local)
    ex = pls_exchange(index.body(), spec, WORLD)
    now = ex.partition(RANK, epoch)
    new = now if epoch == 0 else np.setdiff1d(now, ex.partition(RANK, epoch - 1))
    return int(index.record_lengths(now).sum()), int(index.record_lengths(new).sum())


def torn_bytes(index: RecordIndex) -> int:
    """Bytes of the torn last lines this rank (the last) stages with its partition at epoch 0."""
    return int(index.record_lengths(index.unterminated_ids).sum()) if RANK == WORLD - 1 else 0


def stage_files(stage_dir) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(stage_dir) for f in fs)


def source_bytes(m, epoch: int) -> int:
    return m.stats()["read_bytes"].get(str(epoch), {}).get("source_bytes", 0)


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def staged_epochs(plain, staged, local: str, epochs: int = 3):
    """Both mounts (of `FILES`, `ARGS`) through ``epochs`` epochs: every view of the staged one
    equals the unstaged one's, and it read from the source its partitions at epoch 0, then only
    the records it received (the last rank's torn lines staged at epoch 0 and kept); yields ``(epoch, partition bytes, received bytes)`` for more checks."""
    pool = PooledIndex([index_of(FILES[s]) for s in SHARDS]).torn_last()
    single = index_of(FILES["a.jsonl"])
    torn = torn_bytes(single) + torn_bytes(pool)
    assert torn > 0
    for epoch in range(epochs):
        for m in (plain, staged):
            m.set_epoch(epoch)
        for rel in FILES:
            assert read(staged.path(rel)) == read(plain.path(rel)), f"{rel} epoch {epoch}"
        shares = [partition_bytes(single, local, epoch), partition_bytes(pool, local, epoch)]
        share, received = sum(s for s, _ in shares), sum(r for _, r in shares)
        assert source_bytes(staged, epoch) == (share + torn if epoch == 0 else received)
        yield epoch, share, received


@pytest.mark.parametrize("local", ["uniform", "corgipile"])
def test_a_staged_rank_serves_the_same_bytes_and_reads_only_received_records_from_the_source(mount, tmp_path, local):
    stage_dir = tmp_path / "stage"
    plain = mount(FILES, *ARGS, "--pls-local", local)
    staged = mount(None, *ARGS, "--pls-local", local, "--stage-dir", str(stage_dir), src=plain.src)
    for epoch, share, received in staged_epochs(plain, staged, local):
        assert source_bytes(plain, epoch) >= share  # unstaged: the whole share, every epoch
        if epoch:
            assert 0 < received < (Q + 0.1) * share
        # the views read their records from the stage, none from the source
        stats = staged.stats()["read_bytes"][str(epoch)]
        assert stats["stage_bytes"] >= share
    # loader parts read the same stage: no more source bytes, and together the rank's records
    before = source_bytes(staged, 2)
    parts = collections.Counter()
    for i in range(2):
        parts += lines(read(staged.path(f".parts/2/{i}/a.jsonl")))
    assert parts == lines(read(staged.path("a.jsonl")))
    assert source_bytes(staged, 2) == before  # the last part's torn line too is in the stage
    # stages of epochs gone are dropped: epoch 2's and (built ahead) epoch 3's remain
    wait_for(lambda: {s["epoch"] for s in staged.stats()["staging"]["stages"]} == {2, 3})
    assert len(stage_files(stage_dir)) == 4  # two stages for the file, two for the pool
    staged.stop()
    assert staged.returncode == 0
    assert stage_files(stage_dir) == [] and os.listdir(stage_dir) == []


def test_a_source_changed_under_a_staged_view_is_estale(mount, tmp_path):
    m = mount({"a.jsonl": jsonl(2000, 3, 100)}, *ARGS, "--stage-dir", str(tmp_path / "stage"))
    assert error_after_appending(m.path("a.jsonl"), m.src / "a.jsonl", b'{"late": 1}\n').errno == errno.ESTALE
    assert "a.jsonl" in " ".join(m.stats()["last_errors"])


@pytest.mark.parametrize("extra, message", [
    (["--strategy", "corgipile"], "needs --strategy pls"),
    (["--stage-dir", "{src}/stage"], "inside the source"),
])
def test_stage_dir_usage_errors(tmp_path, extra, message):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    args = [*ARGS, "--stage-dir", str(tmp_path / "stage")] + [a.format(src=src) for a in extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt), "--cache-dir",
                        str(tmp_path / "cache"), *args], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not os.listdir(src)


def test_the_stage_dir_option_is_explained():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "shufflefs", "mount", "--help"], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert "--stage-dir" in out and "received" in out


def test_stat_shows_source_bytes_per_epoch(mount, tmp_path):
    m = mount({"a.jsonl": jsonl(1500, 4, 100)}, *ARGS, "--stage-dir", str(tmp_path / "stage"))
    read(m.path("a.jsonl"))
    wait_for(lambda: len(m.stats()["staging"]["stages"]) == 2)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(m.mnt)], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert "epoch 0: from the source" in out and "from stages" in out
    assert "stage dir" in out and "a.jsonl epoch 1" in out


def test_the_staging_tool_reports_the_received_share(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, str(REPO / "tools" / "bench.py"), "--only", "staging", "--records", "6000", "--world", "2",
                          "--exchange", "0.5", "--epochs", "2", "--block-size", "16KiB"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| 0.5 |")]
    assert [int(r[1]) for r in rows] == [0, 1]
    ratio, received = float(rows[1][4]), float(rows[1][5])
    assert float(rows[0][4]) == 1.0 and 0.3 < received < 0.55 and abs(ratio - received) < 0.1
    assert os.listdir(tmp_path) == []  # its mounts and files are gone
