"""Level: mounted (real FUSE mounts of a real local S3 server, moto's, behind a counting proxy;
real readers).

Parquet objects under a bucket prefix are served as Parquet views, as local files are: every row
once per epoch in an order of its own, the source's schema and metadata; the decoded copy is
filled by ranged GETs of whole row groups (at most 9 MiB each), so a first epoch costs the
index's GETs, two footer reads and one GET per row group of up to 9 MiB, and later epochs none;
a published index (``shufflefs index --publish``) spares the download that indexing takes;
numbered Parquet shards in a bucket are one pool."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
pytest.importorskip("boto3")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

import parquet_files as pf  # noqa: E402
from conftest import Mount  # noqa: E402
from objstore import CREDENTIALS, S3Server  # noqa: E402

from shufflefs.formats.parquet.footer import footer_of_file  # noqa: E402
from shufflefs.sources.objects import PART, PART_SLACK  # noqa: E402

MOST = PART + PART_SLACK
"""The longest ranged GET: a longer run is cut into equal parts no longer."""

BUCKET = "data"
ARGS = ("--seed", "5", "--buffer", "4MiB", "--block-size", "256KiB")
N, GROUP = 20_000, 2_000
SHARDS, PER = 3, 6_000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """The server with ``pq/sorted.parquet`` (label-sorted, 10 row groups, about 11 MB, so its
    download takes two parts), ``rich/types.parquet`` (every column type) and ``pool/`` (three
    numbered shards), and the same files on local disk (``server.local``)."""
    work = tmp_path_factory.mktemp("s3pq")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        server = S3Server(work).start()
        try:
            local = work / "local"
            (local / "pq").mkdir(parents=True)
            (local / "rich").mkdir()
            (local / "pool").mkdir()
            pf.label_sorted(local / "pq" / "sorted.parquet", n=N, group_rows=GROUP)
            pq.write_table(pf.arrow_table(3_000, seed=8), local / "rich" / "types.parquet", row_group_size=700)
            whole = pq.read_table(local / "pq" / "sorted.parquet").slice(0, SHARDS * PER)
            for i in range(SHARDS):
                pq.write_table(whole.slice(i * PER, PER), local / "pool" / f"train-{i:05d}-of-{SHARDS:05d}.parquet",
                               row_group_size=1_500)
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            for path in sorted(local.rglob("*.parquet")):
                rel = path.relative_to(local).as_posix()
                client.put_object(Bucket=BUCKET, Key=rel, Body=path.read_bytes())
                client.put_object(Bucket=BUCKET, Key=f"again/{rel}", Body=path.read_bytes())
            server.local = local
            yield server
        finally:
            server.stop()


def s3_mount(mount, server: S3Server, prefix: str, *args: str) -> Mount:
    return mount(None, *ARGS, *args, "--endpoint-url", server.endpoint, src=f"s3://{BUCKET}/{prefix}", name="s3")


def first_epoch_gets(path: Path) -> int:
    """GETs a first epoch of a Parquet object's view costs without a published index: its
    download for the index in parts of at most 9 MiB, a probe for a published index, the footer read
    when the index is checked and once more by the copy, and each row group's bytes in parts."""
    size = path.stat().st_size
    spans = footer_of_file(str(path)).group_spans
    return math.ceil(size / MOST) + 1 + 2 + sum(math.ceil((b - a) / MOST) for a, b in spans)


def test_an_object_is_served_as_a_parquet_view_from_ranged_gets_of_its_row_groups(mount, s3):
    """Holds: SEMANTICS.md#views-parquet-objects"""
    src = s3.local / "pq" / "sorted.parquet"
    source = pq.read_table(src)
    before = (s3.faults.gets, s3.faults.bytes)
    m = s3_mount(mount, s3, "pq")
    orders = []
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        view = m.path("sorted.parquet")
        table = pq.read_table(view)
        ids = table.column("id").to_pylist()
        assert sorted(ids) == list(range(N))  # every row exactly once
        assert table.schema.equals(source.schema, check_metadata=True)
        assert pf.plain(table.sort_by("id")).equals(pf.plain(source))  # the rows, dictionaries aside
        assert pd.read_parquet(view)["id"].tolist() == ids
        orders.append(ids)
        if epoch == 0:
            gets, sent = s3.faults.gets - before[0], s3.faults.bytes - before[1]
            assert gets == first_epoch_gets(src), gets
            assert sent < 2.1 * src.stat().st_size  # the download to index it, and the row groups once
            copied = s3.faults.gets
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert s3.faults.gets == copied  # later epochs read the copy only
    info = json.loads(m.xattr("info", "sorted.parquet"))
    copy = info["parquet"]["copy"]
    assert copy["copied"] == copy["row_groups"] == N // GROUP
    assert copy["fetched_row_groups"] == N // GROUP and copy["stray_reads"] == 0
    assert m.stats()["store_requests"]["index_built"] == 1


def test_every_column_type_reads_back_as_from_local_disk(mount, s3):
    """Holds: SEMANTICS.md#views-parquet-objects"""
    remote = s3_mount(mount, s3, "rich")
    local = mount(None, *ARGS, src=s3.local / "rich", name="local")
    for epoch in (0, 3):
        remote.set_epoch(epoch)
        local.set_epoch(epoch)
        got = remote.path("types.parquet").read_bytes()
        assert got == local.path("types.parquet").read_bytes()  # the same view, byte for byte
        table = pq.read_table(remote.path("types.parquet"))
        assert pf.plain(table.sort_by("id")).equals(pf.plain(pq.read_table(s3.local / "rich" / "types.parquet")))
    copy = json.loads(remote.xattr("info", "types.parquet"))["parquet"]["copy"]
    assert copy["stray_reads"] == 0 and copy["fetched_row_groups"] == copy["row_groups"]


def publish(s3, prefix: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", "index", f"s3://{BUCKET}/{prefix}", "--publish",
                           "--endpoint-url", s3.endpoint, "--cache-dir", str(cache)],
                          capture_output=True, text=True, timeout=300)


def test_a_published_index_spares_the_download(mount, s3, tmp_path):
    """Holds: SEMANTICS.md#views-parquet-objects"""
    r = publish(s3, "again/pq", tmp_path / "publisher")
    assert r.returncode == 0 and "1 published" in r.stdout, r.stdout + r.stderr
    src = s3.local / "pq" / "sorted.parquet"
    before = (s3.faults.gets, s3.faults.bytes)
    m = s3_mount(mount, s3, "again/pq")
    table = pq.read_table(m.path("sorted.parquet"))
    assert sorted(table.column("id").to_pylist()) == list(range(N))
    gets, sent = s3.faults.gets - before[0], s3.faults.bytes - before[1]
    spans = footer_of_file(str(src)).group_spans
    assert gets == 1 + 2 + sum(math.ceil((b - a) / MOST) for a, b in spans), gets  # the index, footers, groups
    assert sent < 1.1 * src.stat().st_size
    counts = m.stats()["store_requests"]
    assert counts["index_published"] == 1 and counts["index_built"] == 0


def test_numbered_parquet_objects_are_one_pool(mount, s3):
    """Holds: SEMANTICS.md#views-parquet-objects"""
    m = s3_mount(mount, s3, "pool")
    names = [f"train-{i:05d}-of-{SHARDS:05d}.parquet" for i in range(SHARDS)]
    schema = pq.read_schema(s3.local / "pool" / names[0])
    orders = []
    for epoch in (0, 1):
        m.set_epoch(epoch)
        tables = [pq.read_table(m.path(name)) for name in names]
        ids = [t.column("id").to_pylist() for t in tables]
        assert sorted(sum(ids, [])) == list(range(SHARDS * PER))
        assert all(t.schema.equals(schema, check_metadata=True) for t in tables)
        assert all(len(set(t.column("label").to_pylist())) > SHARDS for t in tables)  # rows of every member
        orders.append(ids)
    assert orders[0] != orders[1]
    assert json.loads(m.xattr("info", names[0]))["pool_shards"] == SHARDS


def test_a_mixture_of_parquet_objects(mount, s3, tmp_path):
    """Holds: SEMANTICS.md#views-parquet-objects, SEMANTICS.md#mix-parquet"""
    cfg = tmp_path / "mix.toml"
    cfg.write_text('[[mix]]\nname = "blend"\nsamples = 9000\nshards = 2\n'
                   '[[mix.source]]\nglob = "train-0000[01]-*.parquet"\nweight = 1\n'
                   '[[mix.source]]\nglob = "train-00002-*.parquet"\nweight = 1\n')
    m = s3_mount(mount, s3, "pool", "--config", str(cfg))
    whole = pa.concat_tables([pq.read_table(p) for p in sorted((s3.local / "pool").glob("*.parquet"))])
    d = m.path(".mix/blend")
    names = sorted(os.listdir(d))
    assert names == ["blend-00000-of-00002.parquet", "blend-00001-of-00002.parquet"]
    for epoch in (0, 1):
        m.set_epoch(epoch)
        view = pa.concat_tables([pq.read_table(d / n) for n in names])
        ids = np.asarray(view.column("id"))
        assert np.count_nonzero(ids < 2 * PER) == 4500 and np.count_nonzero(ids >= 2 * PER) == 4500  # the quotas
        first = ids[ids < 2 * PER]
        assert len(np.unique(first)) == 4500  # 12,000 rows: two epochs within its first pass
        if epoch == 0:  # the first pass over the 6,000 rows of the other source
            assert len(np.unique(ids)) == 9000
        want = whole.take(pa.array(np.sort(ids)))
        assert pf.plain(view.sort_by("id")).equals(pf.plain(want))  # whole rows, as in the objects
    copy = json.loads(m.xattr("info", f".mix/blend/{names[0]}"))["parquet"]["copy"]
    assert copy["stray_reads"] == 0 and copy["fetched_row_groups"] == copy["copied"] > 0


def test_a_rewritten_object_is_shown_anew_and_never_mixed(mount, s3):
    """Holds: SEMANTICS.md#views-parquet-objects, SEMANTICS.md#changes-new-open"""
    import errno
    import io
    import time

    client = s3.client()
    old = pf.arrow_table(2_000, seed=11)
    new = pf.arrow_table(2_500, seed=12)

    def put(t):
        """Write ``t`` as the object; the table as read back from it (some types change)."""
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=500)
        client.put_object(Bucket=BUCKET, Key="changing/c.parquet", Body=buf.getvalue())
        return pq.read_table(pa.BufferReader(buf.getvalue()))

    old = put(old)
    m = s3_mount(mount, s3, "changing")
    with open(m.path("c.parquet"), "rb", buffering=0) as f:
        head = f.read(1 << 16)
        new = put(new)
        time.sleep(2.5)  # past the listing's lifetime
        try:
            rest = f.read()
        except OSError as e:  # a row group not copied yet: its GET finds the object changed
            assert e.errno == errno.ESTALE
        else:  # every row group was copied for the first window: the old version, whole
            got = pq.read_table(pa.BufferReader(head + rest))
            assert pf.plain(got.sort_by("id")).equals(pf.plain(old))
    got = pq.read_table(m.path("c.parquet"))
    assert pf.plain(got.sort_by("id")).equals(pf.plain(new))
