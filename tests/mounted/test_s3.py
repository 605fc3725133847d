"""Object storage: a bucket prefix on a real local S3 server (moto's server mode) mounted through
FUSE shows exactly what the same tree mounted from local disk shows, in every format, strategy,
epoch, rank share and loader part; and a changed object, 500s, a stalled server and a server that
goes away are errors (ESTALE, EIO) with the object and range named, never wrong bytes, and the
mount recovers when the server does."""

from __future__ import annotations

import collections
import errno
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
pytest.importorskip("boto3")

from conftest import Mount, write_tree  # noqa: E402
from objstore import CREDENTIALS, S3Server  # noqa: E402
from test_mount import ARGS, csv_text, jsonl, lines, npy_bytes, read, tfrecords  # noqa: E402

BUCKET = "data"
RNG = np.random.default_rng(99)


def tar_shard(first: int, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(first, first + n):
            for ext, payload in (("txt", b"sample %d " % i + b"t" * (i % 50)), ("cls", b"%d" % (i % 10))):
                info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def dataset(tmp: Path) -> dict[str, bytes]:
    files = {
        "a.jsonl": jsonl(3000, 1),
        "table.csv": csv_text(1500),
        "arr.npy": npy_bytes(np.arange(900 * 5, dtype=np.float32).reshape(900, 5)),
        "fixed.bin": RNG.bytes(24 * 2000),
        "blob.dat": RNG.bytes(70_000),
        "nested/deeper/n.jsonl": jsonl(400, 2),
        **{f"pool/train-{i:05d}-of-00004.jsonl": jsonl(500 + 37 * i, 10 + i) for i in range(4)},
        **{f"wds/shard-{i:06d}.tar": tar_shard(100 * i, 60) for i in range(3)},
        "odd names/ü ber #1.jsonl": jsonl(300, 3),
        "empty.jsonl": b"",
    }
    tfrecords([RNG.bytes(int(n)) for n in RNG.integers(1, 300, 400)], tmp / "recs.tfrecord")
    files["recs.tfrecord"] = (tmp / "recs.tfrecord").read_bytes()
    return files


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """The server, with the dataset under ``ds/`` and the same tree on local disk."""
    work = tmp_path_factory.mktemp("s3")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        server = S3Server(work).start()
        try:
            files = dataset(work)
            client = server.client()
            client.create_bucket(Bucket=BUCKET)
            for rel, body in files.items():
                client.put_object(Bucket=BUCKET, Key=f"ds/{rel}", Body=body)
            client.put_object(Bucket=BUCKET, Key="ds/marker/", Body=b"")  # a console's "folder": an empty directory
            server.files = files
            server.local = write_tree(work / "local", files)
            yield server
        finally:
            server.stop()


def s3_mount(mount, server: S3Server, *args: str, prefix: str = "ds") -> Mount:
    return mount(None, *args, "--endpoint-url", server.endpoint, src=f"s3://{BUCKET}/{prefix}", name="s3")


def tree_bytes(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = read(p)
    return out


@pytest.mark.parametrize("strategy", ["corgipile", "full", "lirs-page", "none", "window"])
def test_views_from_the_bucket_equal_views_from_local_disk(mount, s3, strategy):
    args = [*ARGS, "--strategy", strategy]
    remote, local = s3_mount(mount, s3, *args), mount(None, *args, src=s3.local, name="local")
    for epoch in (0, 3):
        remote.set_epoch(epoch)
        local.set_epoch(epoch)
        got, want = tree_bytes(remote.mnt), tree_bytes(local.mnt)
        assert sorted(got) == sorted(s3.files)
        assert os.listdir(remote.path("marker")) == []
        for rel in s3.files:
            assert got[rel] == want[rel], f"{rel} epoch {epoch}"
        if strategy != "none":
            assert got["a.jsonl"] != s3.files["a.jsonl"]
        assert lines(got["a.jsonl"]) == lines(s3.files["a.jsonl"])
    assert got["blob.dat"] == s3.files["blob.dat"]  # not a data file: served as it is
    st = remote.stats()
    assert st["errors"] == 0
    assert st["store_requests"]["requests"] > 0
    assert all(e["source_requests"] > 0 for e in st["read_bytes"].values())


def test_views_from_the_bucket_and_local_disk_are_equal_where_block_size_and_buffer_match(mount, s3):
    """Holds: SEMANTICS.md#views-order

    With the defaults a bucket's views take 4 MiB blocks (the 64 MiB buffer / 16) and a local
    copy's a block size per file: their bytes differ, and the info attribute and ``shufflefs
    stat`` say why.  Given the same effective block size (``--block-size 4MiB`` locally), every
    view is the same bytes."""
    remote = s3_mount(mount, s3, "--seed", "5")
    local = mount(None, "--seed", "5", src=s3.local, name="local")
    same = mount(None, "--seed", "5", "--block-size", "4MiB", src=s3.local, name="same")
    rels = ["a.jsonl", "table.csv", "nested/deeper/n.jsonl", "pool/train-00001-of-00004.jsonl",
            "wds/shard-000001.tar", "recs.tfrecord", "arr.npy"]
    differ = set()
    for epoch in (0, 2):
        for m in (remote, local, same):
            m.set_epoch(epoch)
        for rel in rels:
            got, mine, want = (json.loads(m.xattr("info", rel)) for m in (remote, local, same))
            assert (got["block_size"], got["buffer_bytes"]) == (want["block_size"], want["buffer_bytes"]) \
                == (4 << 20, 64 << 20), rel
            assert "object-store default" in got["block_size_from"] and mine["block_size_from"].startswith("auto")
            assert read(remote.path(rel)) == read(same.path(rel)), f"{rel} epoch {epoch}"
            assert mine["block_size"] < 4 << 20 and mine["buffer_bytes"] == 64 << 20
            if read(local.path(rel)) != read(remote.path(rel)):
                differ.add(rel)
    assert differ == set(rels)  # other blocks, other bytes
    stat = {name: subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(m.mnt)], capture_output=True,
                                 text=True, timeout=60).stdout for name, m in (("remote", remote), ("local", local))}
    assert "effective         block_size=4MiB  buffer=64MiB" in stat["remote"], stat["remote"]
    assert "effective         block_size=4KiB  buffer=64MiB" in stat["local"], stat["local"]


def test_rank_shares_and_loader_parts_from_the_bucket(mount, s3):
    shares = collections.Counter()
    for rank in (0, 1):
        args = [*ARGS, "--world-size", "2", "--rank", str(rank)]
        remote, local = s3_mount(mount, s3, *args), mount(None, *args, src=s3.local, name="local")
        for rel in ("a.jsonl", "pool/train-00002-of-00004.jsonl"):
            assert read(remote.path(rel)) == read(local.path(rel))
        shares += lines(read(remote.path("a.jsonl")))
        for i in range(2):
            rel = f".parts/2/{i}/wds/shard-000001.tar"
            assert read(remote.path(rel)) == read(local.path(rel))
    assert shares == lines(s3.files["a.jsonl"])  # every record once across the ranks


def write_object(server: S3Server, rel: str, body: bytes) -> None:
    server.client().put_object(Bucket=BUCKET, Key=f"ds/{rel}", Body=body)


def test_a_changed_object_is_estale_never_mixed_bytes(mount, s3, tmp_path):
    rel = "changing/c.jsonl"
    old = jsonl(4000, 5)
    write_object(s3, rel, old)
    m = s3_mount(mount, s3, *ARGS)
    with open(m.path(rel), "rb", buffering=0) as f:
        first = f.read(20_000)
        write_object(s3, rel, jsonl(4000, 6))  # same size class, other bytes
        with pytest.raises(OSError) as e:
            while f.read(1 << 16):
                pass
    assert e.value.errno == errno.ESTALE
    served = lines(first[: first.rindex(b"\n") + 1])
    assert served and not (served - lines(old))  # what was served came from the old version only
    log = m.stderr()
    assert "s3://data/ds/changing/c.jsonl" in log and "changed" in log
    # a new open after the listing expires sees the new version, shuffled
    time.sleep(2.5)
    assert lines(read(m.path(rel))) == lines(jsonl(4000, 6))


def test_500s_are_retried_then_eio_naming_the_range_and_the_mount_recovers(mount, s3):
    m = s3_mount(mount, s3, *ARGS, "--retries", "2")
    want = s3.files["a.jsonl"]
    s3.faults.fail = 2  # fewer than the retries: served correctly
    assert lines(read(m.path("a.jsonl"))) == lines(want)
    m.set_epoch(1)
    s3.faults.fail = 1000
    try:
        with pytest.raises(OSError) as e:
            read(m.path("a.jsonl"))
        assert e.value.errno == errno.EIO
    finally:
        s3.faults.fail = 0
    assert "s3://data/ds/a.jsonl" in m.stderr() and "bytes=" in m.stderr()
    assert lines(read(m.path("a.jsonl"))) == lines(want)  # the same mount, the server healthy again
    assert m.stats()["store_requests"]["failed"] >= 1


def test_a_stalled_server_times_out_to_eio_then_recovers(mount, s3):
    m = s3_mount(mount, s3, *ARGS, "--request-timeout", "1", "--retries", "1")
    m.set_epoch(2)
    s3.faults.stall = 3.0
    try:
        t = time.monotonic()
        with pytest.raises(OSError) as e:
            read(m.path("nested/deeper/n.jsonl"))
        assert e.value.errno == errno.EIO
        assert time.monotonic() - t < 30
    finally:
        s3.faults.stall = 0.0
    assert lines(read(m.path("nested/deeper/n.jsonl"))) == lines(s3.files["nested/deeper/n.jsonl"])


def test_the_server_going_away_mid_read_is_eio_and_the_mount_comes_back(mount, s3):
    m = s3_mount(mount, s3, *ARGS, "--request-timeout", "2", "--retries", "1")
    want = s3.files["pool/train-00001-of-00004.jsonl"]
    path = m.path("pool/train-00001-of-00004.jsonl")
    with open(path, "rb", buffering=0) as f:
        got = f.read(4096)
        s3.down()
        try:
            # the rest of this shard, then the pool's other shards: the windows still to come are
            # fetched after the server went away (which ones this shard's first windows cover
            # depends on the order; the daemon keeps a few windows, not the pool)
            with pytest.raises(OSError) as e:
                while f.read(1 << 16):
                    pass
                for i in (2, 3, 0):
                    read(m.path(f"pool/train-{i:05d}-of-00004.jsonl"))
            assert e.value.errno == errno.EIO
        finally:
            s3.up()
    assert got
    assert m.proc.poll() is None and Path(m.mnt).is_dir()
    full = read(path)  # the mount recovers
    pool = collections.Counter()
    for i in range(4):
        pool += lines(s3.files[f"pool/train-{i:05d}-of-00004.jsonl"])
    assert not (lines(full) - pool) and len(full) > 0
    assert lines(b"".join(read(m.path(f"pool/train-{i:05d}-of-00004.jsonl")) for i in range(4))) == pool
    del want


def test_bad_sources_fail_at_mount_with_a_clear_message(mount, s3, tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for src, expect in (("s3://no-such-bucket/x", "s3://no-such-bucket/x: LIST refused: 404 Not Found, NoSuchBucket: "
                                                  "The specified bucket does not exist (no such bucket: check its name"),
                        ("s3://", "s3://BUCKET"), ("s3://b/p?versionId=1", "s3://BUCKET"),
                        (f"s3://{BUCKET}/dss", f"s3://{BUCKET}/dss: no object under this prefix (beside it: ds/)"),
                        (f"s3:/{BUCKET}/ds", "written with two slashes: s3://BUCKET[/PREFIX]"),
                        (f"s3:{BUCKET}/ds", "written with two slashes: s3://BUCKET[/PREFIX]"),
                        (str(s3.local), "only for object-store sources")):
        r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", src, str(mnt), "--cache-dir", str(tmp_path / "c"),
                            "--endpoint-url", s3.endpoint], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode != 0 and not os.path.ismount(mnt), src
        assert expect in r.stderr and "<?xml" not in r.stderr, r.stderr


@pytest.mark.parametrize("local", ["uniform", "corgipile"])
def test_a_staged_rank_reads_only_received_records_from_the_bucket(mount, s3, tmp_path, local):
    from test_mount_stage import ARGS as PLS, FILES, staged_epochs

    for rel, body in FILES.items():
        s3.client().put_object(Bucket=BUCKET, Key=f"stage/{rel}", Body=body)
    plain = mount(FILES, *PLS, "--pls-local", local, name="local")
    staged = s3_mount(mount, s3, *PLS, "--pls-local", local, "--stage-dir", str(tmp_path / "stage"), prefix="stage")
    for epoch, share, _ in staged_epochs(plain, staged, local):
        counts = staged.stats()["read_bytes"][str(epoch)]
        assert counts["stage_bytes"] >= share and counts["source_requests"] > 0
    staged.stop()
    assert staged.returncode == 0 and os.listdir(tmp_path / "stage") == []


def test_indexes_are_cached_by_etag_so_a_remount_does_not_download_again(mount, s3, tmp_path):
    cache = str(tmp_path / "shared-cache")
    want = s3.files["a.jsonl"]
    first = s3_mount(mount, s3, *ARGS, "--cache-dir", cache)
    before = s3.faults.bytes
    with open(first.path("a.jsonl"), "rb") as f:
        f.read(1)
    assert s3.faults.bytes - before >= len(want)  # indexing reads the whole object once
    first.stop()
    second = s3_mount(mount, s3, *ARGS, "--cache-dir", cache)
    before = s3.faults.bytes
    with open(second.path("a.jsonl"), "rb", buffering=0) as f:  # one byte: the first window only
        f.read(1)
    assert s3.faults.bytes - before < len(want) // 2  # only a window, the index came from the cache
    assert lines(read(second.path("a.jsonl"))) == lines(want)


def test_credentials_from_the_shared_files_when_the_environment_has_none(mount, s3, tmp_path, monkeypatch):
    creds = tmp_path / "credentials"
    creds.write_text("[bench]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    config = tmp_path / "config"
    config.write_text("[profile bench]\nregion = us-east-1\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "bench")
    m = s3_mount(mount, s3, *ARGS)
    assert lines(read(m.path("a.jsonl"))) == lines(s3.files["a.jsonl"])


def test_many_readers_at_once_get_the_local_bytes(mount, s3):
    import concurrent.futures

    remote, local = s3_mount(mount, s3, *ARGS, "--requests", "4"), mount(None, *ARGS, src=s3.local, name="local")
    names = [rel for rel in s3.files if rel.endswith((".jsonl", ".tar", ".npy"))] * 2
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda rel: read(remote.path(rel)), names))
    for rel, data in zip(names, got):
        assert data == read(local.path(rel)), rel


def test_object_storage_options_are_explained_and_checked(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = lambda *a: subprocess.run([sys.executable, "-m", "shufflefs", *a], capture_output=True, text=True,  # noqa: E731
                                    env=env, timeout=60)
    help_text = run("mount", "--help").stdout
    for word in ("s3://BUCKET/PREFIX", "--endpoint-url", "--requests", "--request-timeout", "--retries", "AWS_PROFILE"):
        assert word in help_text
    (tmp_path / "mnt").mkdir()
    for bad, message in ((["--requests", "0"], "--requests"), (["--request-timeout", "nan"], "--request-timeout"),
                         (["--retries", "-1"], "--retries"), (["--endpoint-url", "ftp://x"], "http(s) URL")):
        r = run("mount", "s3://bucket/p", str(tmp_path / "mnt"), *bad)
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_resumed_views_from_the_bucket_equal_resumed_views_from_local_disk(mount, s3, tmp_path):
    """A resume state (a stop on two ranks) gives the bucket's views the bytes the same tree's
    resumed views have on local disk (whose records are checked in test_mount_resume).

    Holds: SEMANTICS.md#resume-once"""
    state = {"epoch": 2, "views": {rel: [{"world_size": 2, "parts": 1, "consumed": c}] for rel, c in {
        "a.jsonl": [[700], [13]], "pool/train-00001-of-00004.jsonl": [[40], [0]], "wds/shard-000002.tar": [[5], [3]],
        "arr.npy": [[100], [250]], "recs.tfrecord": [[7], [70]]}.items()}}
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    remote, local = s3_mount(mount, s3, *ARGS), mount(None, *ARGS, src=s3.local, name="local")
    for m in (remote, local):
        os.setxattr(m.mnt, "user.shufflefs.resume", b"@" + os.fsencode(path))
    for rel in (*state["views"], "pool/train-00003-of-00004.jsonl", "wds/shard-000000.tar", "table.csv"):
        got, want = read(remote.path(rel)), read(local.path(rel))
        assert got == want, rel
    assert lines(read(local.path("a.jsonl"))) != lines(s3.files["a.jsonl"])  # the state applied
    assert json.loads(remote.xattr("info", "a.jsonl"))["resumed"] is True


def publish(s3, prefix: str, cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", "index", f"s3://{BUCKET}/{prefix}", "--publish",
                           "--endpoint-url", s3.endpoint, "--cache-dir", str(cache), *args],
                          capture_output=True, text=True, timeout=300)


def test_published_indexes_make_a_fresh_node_cheap(mount, s3, tmp_path):
    """``shufflefs index s3://... --publish`` (in two parts, as two machines would) writes every
    object's index beside the data; a fresh mount then fetches a pool's indexes instead of its
    objects: under 30% of the pool's bytes before the first MiB of a shard (against all of them
    without), the prefix of indexes is never shown, and a rewritten object's old index is not
    used for its new version."""
    members = {f"big/part-{i:05d}.jsonl": jsonl(4000, 50 + i, width=2000) for i in range(8)}
    client = s3.client()
    for key, body in members.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
        client.put_object(Bucket=BUCKET, Key=f"unpublished/{key}", Body=body)
    total = sum(map(len, members.values()))
    for i in range(2):
        r = publish(s3, "big", tmp_path / f"machine{i}", "--part", f"{i}/2")
        assert r.returncode == 0 and "4 published" in r.stdout, r.stdout + r.stderr
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="big/.shufflefs/index/")
    assert len(listed.get("Contents", [])) == len(members)

    def first_mib(prefix: str) -> tuple[int, Mount]:
        m = s3_mount(mount, s3, "--buffer", "8MiB", "--block-size", "8MiB", "--seed", "1", prefix=prefix)
        before = s3.faults.bytes
        with open(m.path("part-00003.jsonl"), "rb", buffering=0) as f:
            assert len(f.read(1 << 20)) == 1 << 20
        return s3.faults.bytes - before, m

    sent, fresh = first_mib("big")
    assert sent < 0.3 * total, f"{sent} bytes sent for the first MiB of a {total}-byte pool"
    got = fresh.stats()["store_requests"]
    assert got["index_published"] == len(members) and got["index_built"] == 0
    shown = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(fresh.mnt)], capture_output=True, text=True,
                           timeout=60)
    assert f"{len(members)} taken from the bucket" in shown.stdout and "0 built" in shown.stdout, shown.stdout
    assert ".shufflefs" not in os.listdir(fresh.mnt) and sorted(os.listdir(fresh.mnt)) == sorted(
        rel.split("/", 1)[1] for rel in members)
    sent_without, _ = first_mib("unpublished/big")
    assert sent_without > total  # every object downloaded to index it

    # a rewritten object: its old published index names the old version, so it is built here
    changed = jsonl(3000, 99, width=2000)
    client.put_object(Bucket=BUCKET, Key="big/part-00005.jsonl", Body=changed)
    time.sleep(2.5)  # past the listing cache of any mount
    again = s3_mount(mount, s3, "--buffer", "8MiB", "--block-size", "8MiB", prefix="big")
    got = lines(b"".join(read(again.path(rel.split("/", 1)[1])) for rel in members))
    want = lines(b"".join(changed if rel.endswith("00005.jsonl") else body for rel, body in members.items()))
    assert got == want
    counts = again.stats()["store_requests"]
    assert counts["index_built"] == 1 and counts["index_published"] == len(members) - 1


def test_publishing_needs_a_place_and_a_sane_part(tmp_path):
    for args, message in [([str(tmp_path), "--publish"], "--publish --index-dir DIR"),
                          ([str(tmp_path), "--index-url", "s3://b/p"], "a local source's go to --index-dir"),
                          ([str(tmp_path), "--part", "2/2"], "--part '2/2'"),
                          ([str(tmp_path), "--part", "x"], "expected i/N")]:
        r = subprocess.run([sys.executable, "-m", "shufflefs", "index", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_damaged_or_forged_published_indexes_never_serve_wrong_bytes(mount, s3, tmp_path):
    """A published index that is garbage is dropped and the object indexed here; one forged whole
    (a valid entry for the object's version, its bounds moved) is caught by the window checks
    (EIO, never wrong bytes), and the next open builds the index from the object, not the bucket."""
    from shufflefs.index.table import IndexCache, RecordIndex

    bodies = {f"forged/{n}.jsonl": jsonl(3000, 70 + i) for i, n in enumerate(("a", "b"))}
    client = s3.client()
    for key, body in bodies.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    cache = tmp_path / "publisher"
    assert publish(s3, "forged", cache).returncode == 0
    published = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="forged/.shufflefs/")["Contents"])
    entries = IndexCache(cache)
    by_object = {key: key.rsplit("/", 1)[1][: -len(".npz")] for key in published}
    assert len(by_object) == 2 and all(entries.entry_bytes(name) is not None for name in by_object.values())
    # which published entry is a.jsonl's: the one whose bounds end at a.jsonl's size
    sizes = {len(b): k for k, b in bodies.items()}
    keys = {}
    for key, name in by_object.items():
        with np.load(entries._file(name)) as z:
            keys[sizes[int(z["bounds"][-1])]] = (key, name)
    garbage_key, _ = keys["forged/a.jsonl"]
    client.put_object(Bucket=BUCKET, Key=garbage_key, Body=b"not an index at all")
    forged_key, forged_name = keys["forged/b.jsonl"]
    with np.load(entries._file(forged_name)) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        bounds = z["bounds"].copy()
    bounds[1:-1] += 7  # every record boundary moved a few bytes: still ascending, inside the file
    real = entries.load(forged_name, _stamp_of(meta))
    forged = IndexCache(tmp_path / "forger")
    forged.store(forged_name, RecordIndex(real.size, bounds, real.add_newline, real.stamp))
    client.put_object(Bucket=BUCKET, Key=forged_key, Body=forged.entry_bytes(forged_name))

    m = s3_mount(mount, s3, *ARGS, prefix="forged")
    assert lines(read(m.path("a.jsonl"))) == lines(bodies["forged/a.jsonl"])  # garbage: indexed here
    with pytest.raises(OSError) as e:
        read(m.path("b.jsonl"))
    assert e.value.errno == errno.EIO
    assert lines(read(m.path("b.jsonl"))) == lines(bodies["forged/b.jsonl"])  # rebuilt from the object
    counts = m.stats()["store_requests"]
    assert counts["index_built"] == 2 and counts["index_published"] == 1
    assert "the index found wrong may be the published one" in m.stderr()


def _stamp_of(meta: dict):
    from shufflefs.index.table import SourceStamp

    return SourceStamp(**meta["stamp"])


def test_indexes_published_elsewhere_are_found_with_index_url(mount, s3, tmp_path):
    """``--index-url`` keeps published indexes in another prefix (or bucket) than the data."""
    client = s3.client()
    client.create_bucket(Bucket="indexes")
    members = {f"elsewhere/part-{i:05d}.jsonl": jsonl(500, 80 + i) for i in range(3)}
    for key, body in members.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    r = publish(s3, "elsewhere", tmp_path / "pub", "--index-url", "s3://indexes/ds-idx")
    assert r.returncode == 0 and "3 published" in r.stdout and "s3://indexes/ds-idx" in r.stdout, r.stdout + r.stderr
    assert len(client.list_objects_v2(Bucket="indexes", Prefix="ds-idx/")["Contents"]) == 3
    assert "Contents" not in client.list_objects_v2(Bucket=BUCKET, Prefix="elsewhere/.shufflefs/")
    found = s3_mount(mount, s3, *ARGS, "--index-url", "s3://indexes/ds-idx", prefix="elsewhere")
    plain = s3_mount(mount, s3, *ARGS, prefix="elsewhere")
    everything = lines(b"".join(members.values()))
    for m in (found, plain):  # a pool: its shards together hold its members' records
        assert lines(b"".join(read(m.path(rel.split("/", 1)[1])) for rel in members)) == everything
    assert found.stats()["store_requests"]["index_published"] == 3
    assert plain.stats()["store_requests"]["index_published"] == 0
    bad = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(tmp_path), str(tmp_path / "m"), "--index-url",
                          "http://x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "s3://" in bad.stderr, bad.stderr


def test_the_listing_lifetime_is_an_option(mount, s3, tmp_path):
    """``--listing-ttl``: a long one keeps answering from the listing (a new object is not seen
    until it runs out), the default refreshes within seconds; nonsense is refused."""
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="ttl/a.jsonl", Body=jsonl(50, 1))
    long, default = (s3_mount(mount, s3, *ARGS, *extra, prefix="ttl") for extra in (["--listing-ttl", "600"], []))
    assert os.listdir(long.mnt) == os.listdir(default.mnt) == ["a.jsonl"]
    client.put_object(Bucket=BUCKET, Key="ttl/b.jsonl", Body=jsonl(50, 2))
    time.sleep(2.5)
    assert sorted(os.listdir(default.mnt)) == ["a.jsonl", "b.jsonl"]
    assert os.listdir(long.mnt) == ["a.jsonl"]
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", f"s3://{BUCKET}/ttl", str(tmp_path / "m"),
                        "--listing-ttl", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--listing-ttl" in r.stderr, r.stderr


def test_a_prefix_is_listed_once_however_many_ask_and_a_slow_listing_is_kept_longer(s3):
    """Lookups of many names at once (``ls -l``, a DataLoader's workers) wait for one LIST of the
    directory instead of each listing it; a listing that took long (a prefix of 100,000 objects
    takes seconds) is kept ten times as long as it took, not asked for again every --listing-ttl."""
    from concurrent.futures import ThreadPoolExecutor

    from shufflefs.sources.s3 import SLOW_LISTING, S3Store

    store = S3Store(f"s3://{BUCKET}/ds", endpoint_url=s3.endpoint, listing_ttl=0.1)
    try:
        slow, calls = 0.3, []
        real = store.client.list_dir

        def list_dir(prefix):  # noqa: ANN001, ANN202 -- a slow server
            calls.append(prefix)
            time.sleep(slow)
            return real(prefix)

        store.client.list_dir = list_dir
        with ThreadPoolExecutor(16) as ex:
            got = list(ex.map(lambda _: store.list("pool"), range(16)))
        assert all(g == got[0] for g in got) and len(got[0]) == 4
        assert calls == ["ds/pool"]
        time.sleep(2 * 0.1)  # past --listing-ttl, well within SLOW_LISTING x its time
        store.list("pool")
        assert calls == ["ds/pool"]
        time.sleep(SLOW_LISTING * slow)
        store.list("pool")
        assert calls == ["ds/pool", "ds/pool"]
    finally:
        store.close()


def test_a_flat_prefix_is_listed_page_by_page_and_a_nested_one_by_delimiter(s3, monkeypatch):
    """A prefix of files only is listed as a stream of pages (each turned into entries as it
    arrives, so memory does not hold every page at once); one with subdirectories is listed
    with a delimiter, so its subdirectories' contents are not walked.  Both list what a
    delimited listing lists."""
    import obstore

    from shufflefs.sources import objects
    from shufflefs.sources.objects import ClientOptions, ObjectClient

    client = s3.client()
    for i in range(25):
        client.put_object(Bucket=BUCKET, Key=f"flat/f{i:03d}.jsonl", Body=b"{}\n")
        client.put_object(Bucket=BUCKET, Key=f"deep/f{i:03d}.jsonl", Body=b"{}\n")
    client.put_object(Bucket=BUCKET, Key="deep/sub/g.jsonl", Body=b"{}\n")
    monkeypatch.setattr(objects, "LIST_PAGE", 10)
    oc = ObjectClient(BUCKET, ClientOptions(endpoint_url=s3.endpoint))
    try:
        for prefix, pages in (("flat", 3), ("deep", 4)):  # deep: 3 pages streamed, then a delimited LIST
            before = oc.requests
            dirs, objs = oc.list_dir(prefix)
            want = obstore.list_with_delimiter(oc.store, prefix)
            assert dirs == [p.rstrip("/") for p in want["common_prefixes"]]
            assert sorted(o.key for o in objs) == sorted(m["path"] for m in want["objects"])
            assert oc.requests - before == pages
        assert oc.list_dir("deep")[0] == ["deep/sub"] and oc.list_dir("flat")[0] == []
    finally:
        oc.close()


def test_a_mixture_from_the_bucket_equals_the_mixture_from_local_disk(mount, s3, tmp_path):
    """``[[mix]]`` over objects: the same shards as over the same tree on local disk, in every
    epoch, and a rank's share of them; odd names included."""
    cfg = tmp_path / "mix.toml"
    cfg.write_text('[[mix]]\nname = "blend"\nsamples = 2500\nshards = 3\n'
                   '[[mix.source]]\nglob = "pool/*.jsonl"\nweight = 2\n'
                   '[[mix.source]]\nglob = "a.jsonl"\nweight = 1\n'
                   '[[mix.source]]\nglob = "odd names/*.jsonl"\nweight = 1\n')
    for args in ([*ARGS, "--config", str(cfg)], [*ARGS, "--config", str(cfg), "--rank", "1", "--world-size", "2"]):
        remote, local = s3_mount(mount, s3, *args), mount(None, *args, src=s3.local, name="local")
        for epoch in (0, 3):
            remote.set_epoch(epoch)
            local.set_epoch(epoch)
            names = sorted(os.listdir(remote.path(".mix/blend")))
            assert names == sorted(os.listdir(local.path(".mix/blend"))) and len(names) == 3
            got = [read(remote.path(f".mix/blend/{n}")) for n in names]
            assert got == [read(local.path(f".mix/blend/{n}")) for n in names], f"epoch {epoch} {args}"
            assert sum(len(g.splitlines()) for g in got) == (2500 if "--rank" not in args else 1250)
        assert remote.stats()["errors"] == 0
