"""Level: mounted (real FUSE mounts of a real local S3 server, moto's, behind a counting proxy;
real readers).

Compressed JSON lines objects under a bucket prefix (``.jsonl.gz`` of one gzip member and of
several, ``.jsonl.zst`` in frames and in one frame) are compressed views as local files are: the
same bytes as a mount of a local copy with the same options, read by ``gzip.open`` and
``zstandard`` line loops, every record once per epoch in an order of its own.  A first epoch
costs the download that indexing takes, a probe for a published index, and the ranged GETs of
the object's compressed bytes that its reads decode (or the one download that fills a decoded
copy); later epochs, none.  A published index (``shufflefs index --publish``) spares the
download."""

from __future__ import annotations

import collections
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
pytest.importorskip("boto3")

import compressed_files as cf  # noqa: E402
from conftest import Mount, write_tree  # noqa: E402
from objstore import CREDENTIALS, S3Server  # noqa: E402
from test_compressed_readers import line_loop  # noqa: E402

from shufflefs.sources.objects import PART, PART_SLACK  # noqa: E402

BUCKET = "data"
ARGS = ("--seed", "5")
N = 9000  # records: 6.3 MB decoded, about 2 MB compressed


def objects() -> tuple[dict[str, bytes], bytes]:
    plain = cf.jsonl(N, seed=30)
    return {"multi.jsonl.gz": cf.gz(plain, members=4), "one.jsonl.gz": cf.gz(plain),
            "frames.jsonl.zst": cf.zst(plain, frame=1 << 20), "one.jsonl.zst": cf.zst(plain)}, plain


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """The server with the objects under ``cz/`` (and again under ``pub/``), and the same files
    on local disk (``server.local``)."""
    work = tmp_path_factory.mktemp("s3cz")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        server = S3Server(work).start()
        try:
            files, plain = objects()
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            for prefix in ("cz", "pub"):
                for name, body in files.items():
                    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
            pool = {f"train-{i:05d}-of-00003.jsonl.gz": cf.gz(cf.jsonl(3000, seed=31 + i), members=1 + i) for i in range(3)}
            for name, body in pool.items():
                client.put_object(Bucket=BUCKET, Key=f"pool/{name}", Body=body)
            server.files, server.plain, server.pool = files, plain, pool
            server.local = write_tree(work / "local", files)
            server.local_pool = write_tree(work / "local_pool", pool)
            yield server
        finally:
            server.stop()


def s3_mount(mount, server: S3Server, prefix: str, *args: str, name: str = "s3") -> Mount:
    return mount(None, *ARGS, *args, "--endpoint-url", server.endpoint, src=f"s3://{BUCKET}/{prefix}", name=name)


def first_epoch_gets(size: int) -> int:
    """GETs a first epoch of a compressed object's view costs without a published index: its
    download (for its index, into the copy its views decode) in parts of at most 9 MiB, and a probe for a
    published index."""
    return math.ceil(size / (PART + PART_SLACK)) + 1


def test_compressed_objects_are_views_as_local_files_are(mount, s3):
    """Holds: SEMANTICS.md#views-compressed-objects, SEMANTICS.md#views-order"""
    every = collections.Counter(cf.lines_of(s3.plain))
    local = mount(None, *ARGS, "--block-size", "4MiB", src=s3.local, name="local")  # the bucket's default
    m = s3_mount(mount, s3, "cz")
    for name, body in s3.files.items():
        before = s3.faults.gets, s3.faults.bytes
        orders = []
        for epoch in (0, 1, 2):
            m.set_epoch(epoch)
            local.set_epoch(epoch)
            got = line_loop(m.path(name))
            assert collections.Counter(got) == every, name  # every record once per epoch
            assert m.path(name).read_bytes() == local.path(name).read_bytes(), name
            orders.append(got)
            if epoch == 0:
                gets, sent = s3.faults.gets - before[0], s3.faults.bytes - before[1]
                assert gets == first_epoch_gets(len(body)), (name, gets)
                assert sent < len(body) + 4096, (name, sent)  # the object once (and the probe's answer)
        assert orders[0] != orders[1] != orders[2] != orders[0]
        assert s3.faults.gets - before[0] == gets, name  # later epochs decode the copy, no request
    got = m.stats()
    assert got["store_requests"]["index_built"] == len(s3.files)
    assert got["store_requests"]["packed_copies"] == len(s3.files)
    shown = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(m.mnt)], capture_output=True, text=True,
                           timeout=60)
    assert f"{len(s3.files)} compressed object(s) copied to local disk" in shown.stdout, shown.stdout
    info = json.loads(m.xattr("info", "one.jsonl.zst"))["compressed"]
    assert info["read_from"] == "a decoded copy"  # one frame: decoded once, from the object's copy
    multi = json.loads(m.xattr("info", "multi.jsonl.gz"))["compressed"]  # from restart points, or a copy made
    assert multi["read_from"] == "restart points" or "background" in multi["copied_because"]  # from its local copy


def test_a_record_level_order_and_rank_shares_from_the_bucket(mount, s3):
    """Holds: SEMANTICS.md#views-compressed-objects, SEMANTICS.md#views-compressed-copy,
    SEMANTICS.md#ranks-share"""
    every = collections.Counter(cf.lines_of(s3.plain))
    args = ("--strategy", "full", "--world-size", "2")
    local = mount(None, *ARGS, *args, "--rank", "1", src=s3.local, name="local")
    ranks = [s3_mount(mount, s3, "cz", *args, "--rank", str(r), name=f"s3r{r}") for r in range(2)]
    for name in s3.files:
        shares = [line_loop(m.path(name)) for m in ranks]
        assert sum(map(collections.Counter, shares), collections.Counter()) == every, name
        assert abs(len(shares[0]) - len(shares[1])) <= 1
        assert ranks[1].path(name).read_bytes() == local.path(name).read_bytes(), name


def test_a_pool_of_compressed_objects_balanced_by_a_field(mount, s3):
    """Holds: SEMANTICS.md#views-compressed-objects, SEMANTICS.md#views-compressed-balance,
    SEMANTICS.md#ranks-pools"""
    args = ("--strategy", "full", "--balance-field", "id", "--world-size", "2")
    every = collections.Counter(line for body in s3.pool.values() for line in cf.lines_of(cf.decode("x.gz", body)))
    local = mount(None, *ARGS, *args, "--rank", "1", src=s3.local_pool, name="local")
    before = s3.faults.gets
    ranks = [s3_mount(mount, s3, "pool", *args, "--rank", str(r), name=f"s3r{r}") for r in range(2)]
    got = collections.Counter()
    for m in ranks:
        for name in s3.pool:
            got.update(line_loop(m.path(name)))
    assert got == every  # every record of the pool once over the ranks' shards
    for name in s3.pool:
        assert ranks[1].path(name).read_bytes() == local.path(name).read_bytes(), name
    # each mount: its members' downloads (their indexes, their copies, their costs) and probes
    assert s3.faults.gets - before == 2 * sum(first_epoch_gets(len(body)) for body in s3.pool.values())


def publish(s3, prefix: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", "index", f"s3://{BUCKET}/{prefix}", "--publish",
                           "--endpoint-url", s3.endpoint, "--cache-dir", str(cache)],
                          capture_output=True, text=True, timeout=300)


def test_published_indexes_spare_the_download_for_indexing(mount, s3, tmp_path):
    """Holds: SEMANTICS.md#views-compressed-objects"""
    r = publish(s3, "pub", tmp_path / "publisher")
    assert r.returncode == 0 and f"{len(s3.files)} published" in r.stdout, r.stdout + r.stderr
    assert not list((tmp_path / "publisher").rglob("packed-*"))  # its copies went with it
    m = s3_mount(mount, s3, "pub")
    every = collections.Counter(cf.lines_of(s3.plain))
    for name, body in s3.files.items():
        before = s3.faults.gets, s3.faults.bytes
        assert collections.Counter(line_loop(m.path(name))) == every, name
        gets = s3.faults.gets - before[0]
        assert gets == 1 + math.ceil(len(body) / (PART + PART_SLACK)), (name, gets)  # its index, then the object once
    got = m.stats()["store_requests"]
    assert got["index_published"] == len(s3.files) and got["index_built"] == 0


def test_a_rewritten_object_is_shown_anew_and_never_mixed(mount, s3):
    """Holds: SEMANTICS.md#views-compressed-objects, SEMANTICS.md#changes-new-open"""
    client = s3.client()
    old, new = cf.jsonl(3000, seed=40), cf.jsonl(3500, seed=41)
    client.put_object(Bucket=BUCKET, Key="changing/c.jsonl.gz", Body=cf.gz(old, members=2))
    m = s3_mount(mount, s3, "changing")
    with open(m.path("c.jsonl.gz"), "rb") as f:
        head = f.read(1 << 16)
        client.put_object(Bucket=BUCKET, Key="changing/c.jsonl.gz", Body=cf.gz(new))
        time.sleep(2.5)  # past the listing's lifetime
        rest = f.read()  # the version it opened, whole, from its copy
    assert collections.Counter(cf.lines_of(cf.decode("c.jsonl.gz", head + rest))) == collections.Counter(
        cf.lines_of(old))
    assert collections.Counter(line_loop(m.path("c.jsonl.gz"))) == collections.Counter(cf.lines_of(new))
