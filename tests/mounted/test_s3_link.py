"""A bucket behind an emulated wide-area link (``tools/s3_link.py``: a SeaweedFS S3 server in a
network namespace, 20 ms round trips, 40 MB/s per connection, 200 MB/s in all): the views are
what local disk's are, the mount measures the link it reads over and shows it in ``stat``, and a
sequential reader's loads run ahead across the end of a pool's shard into the next one.
Timings are measured by ``tools/bench.py --only s3-latency``, not asserted here."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("obstore")
pytest.importorskip("boto3")

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from s3_link import EmulatedBucket, missing  # noqa: E402

from conftest import write_tree  # noqa: E402
from test_mount import jsonl, lines  # noqa: E402

if missing() is not None:
    pytest.skip(f"emulated link: {missing()}", allow_module_level=True)

BUCKET = "data"
RTT = 0.02
ARGS = ["--block-size", "256KiB", "--buffer", "1MiB"]
ENV = {"AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", "AWS_DEFAULT_REGION": "us-east-1"}
SHARDS = {f"pool/train-{i:05d}-of-00004.jsonl": jsonl(9000 + 500 * i, 40 + i) for i in range(4)}


@pytest.fixture(scope="module")
def link(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("link")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        with EmulatedBucket(work / "server", RTT, 40e6, 200e6, (BUCKET,)) as b:
            for rel, body in SHARDS.items():
                b.put(BUCKET, f"ds/{rel}", body)
            b.local = write_tree(work / "local", SHARDS)
            yield b


def over_link(mount, link: EmulatedBucket, *args: str):
    return mount(None, *args, "--endpoint-url", link.endpoint, src=f"s3://{BUCKET}/ds", name="link")


def read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        chunks = []
        while chunk := f.read(1 << 20):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("strategy", ["corgipile", "none"])
def test_views_over_the_link_equal_local_disks_and_the_link_is_measured(mount, link, strategy):
    remote = over_link(mount, link, *ARGS, "--strategy", strategy)
    local = mount(None, *ARGS, "--strategy", strategy, src=link.local, name="local")
    for epoch in (0, 1):
        remote.set_epoch(epoch)
        local.set_epoch(epoch)
        for rel in sorted(SHARDS):  # name order: the pool's stream, read as a trainer reads it
            got = read(remote.path(rel))
            assert got == read(local.path(rel)), f"{rel} epoch {epoch}"
    shown = b"".join(read(remote.path(rel)) for rel in sorted(SHARDS))
    assert sorted(lines(shown)) == sorted(ln for body in SHARDS.values() for ln in lines(body))
    store = remote.stats()["store_requests"]
    assert store["link_latency_ms"] >= 0.9 * RTT * 1e3  # no GET can beat the round trip
    assert store.get("link_part_ms", math.inf) >= store["link_latency_ms"]
    assert 2 * (8 << 20) <= store["link_ahead"] <= store["link_ahead_cap"] == 16 * (8 << 20)
    out = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(remote.mnt)], capture_output=True, text=True)
    assert "kept loading ahead" in out.stdout, out.stdout


def test_loads_run_ahead_into_the_next_shard(mount, link):
    """Reading only the first shard loads windows of the second before it is opened: the stream
    of a pool goes on across its shards, and so does a sequential reader's readahead."""
    window = 256 << 10  # a shard spans about three windows of the pool's stream
    m = over_link(mount, link, "--block-size", "64KiB", "--buffer", str(window), "--strategy", "corgipile")
    first = sorted(SHARDS)[0]  # epoch 0: nothing was prepared ahead by an epoch change
    size = len(read(m.path(first)))
    deadline = time.monotonic() + 10
    while True:
        got = m.stats()["read_bytes"].get("0", {}).get("source_bytes", 0)
        if got > size + 2 * window or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got > size + 2 * window, (got, size)  # more than the windows that the first shard cuts


def test_an_epoch_change_over_the_link_serves_the_new_order(mount, link):
    m = over_link(mount, link, *ARGS)
    rel = sorted(SHARDS)[1]
    orders = []
    for epoch in (5, 6):
        m.set_epoch(epoch)
        orders.append(read(m.path(rel)))
    assert orders[0] != orders[1]
    assert m.stats()["errors"] == 0
