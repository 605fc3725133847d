"""Level: mounted (real FUSE mounts, a real local S3 server).

Indexes published in a bucket (``shufflefs index s3://... --publish``, under
``PREFIX/.shufflefs/index/``) are written by whoever can write the prefix, so they are trusted
no more than a cache entry.  Entries forged whole, with their checksum recomputed (every second
bound of a JSON-lines or CSV file dropped, two tar samples merged), are EIO once naming the
object, then never taken again: the object is indexed here and every view equals the same
tree's on local disk.  An entry that fails its check on load is indexed here at once, never an
EIO (it was an EIO on every open).  A tar sample cut in two with the halves in different
windows, or in a stage in front of the bucket, and a directory moved to the sample before it,
are EIO before any wrong sample is served (the neighbours fetched with the windows' records)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
pytest.importorskip("boto3")

from conftest import write_tree  # noqa: E402
from shufflefs.index.table import _digest  # noqa: E402
from test_forged_index import (ARGS, FILES, FORGED_TAR, MERGED, PLS, PLS_SPEC, SPEC, cut_at,  # noqa: E402
                               drop_every_second, eio_then_right, forged_halves, merge_one, served_whole,
                               tar_bytes, window_of, wds_bytes)
from shufflefs.strategies import make_plan  # noqa: E402
from shufflefs.strategies.partial_local import pls_exchange  # noqa: E402
from test_s3 import BUCKET, publish, s3, s3_mount  # noqa: E402,F401 (s3: the server fixture)
from test_mount import jsonl  # noqa: E402


def forge_published(client, prefix: str, body: bytes, change) -> None:
    """Rewrite the published entry of the object holding ``body`` whole, its checksum recomputed."""
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/.shufflefs/index/")["Contents"]
    for o in listed:
        raw = client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        with np.load(io.BytesIO(raw)) as z:
            bounds, meta = z["bounds"].copy(), json.loads(bytes(z["meta"]).decode())
        if meta["size"] != len(body):
            continue
        bounds = np.ascontiguousarray(change(bounds, body), "<i8")
        meta.pop("sum")
        meta["sum"] = _digest(bounds, meta)
        out = io.BytesIO()
        np.savez(out, bounds=bounds, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        client.put_object(Bucket=BUCKET, Key=o["Key"], Body=out.getvalue())
        return
    raise AssertionError("no published entry of that size")


def upload(client, prefix: str, files: dict[str, bytes]) -> None:
    for rel, body in files.items():
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=body)


def test_forged_published_indexes_in_a_bucket_are_eio_once_then_built_here(mount, s3, tmp_path):
    """Holds: SEMANTICS.md#changes-framing, SEMANTICS.md#changes-published"""
    files = {"a.jsonl": FILES["a.jsonl"], "c.csv": FILES["c.csv"], "e.tar": tar_bytes(300)}
    client = s3.client()
    upload(client, "forged2", files)
    assert publish(s3, "forged2", tmp_path / "publisher").returncode == 0
    forge_published(client, "forged2", files["a.jsonl"], drop_every_second)
    forge_published(client, "forged2", files["c.csv"], drop_every_second)
    forge_published(client, "forged2", files["e.tar"], merge_one)
    m = s3_mount(mount, s3, *ARGS, prefix="forged2")
    local = mount(None, *ARGS, src=write_tree(tmp_path / "local", files), name="local")
    for rel, reason in (("a.jsonl", "a newline inside a line"), ("c.csv", "a newline outside quotes inside a row"),
                        ("e.tar", MERGED)):
        eio_then_right(m, local, [rel], reason, rel)
    errors = m.stats()["errors"]
    counts = m.stats()["store_requests"]
    assert counts["index_published"] == 3 and counts["index_built"] == 3
    for epoch in (1, 2):
        m.set_epoch(epoch)
        local.set_epoch(epoch)
        for rel in files:
            assert m.path(rel).read_bytes() == local.path(rel).read_bytes(), (rel, epoch)
    counts = m.stats()["store_requests"]
    assert counts["index_published"] == 3 and counts["index_built"] == 3 and m.stats()["errors"] == errors
    assert "may be the published one" in m.stderr()


def test_a_published_entry_failing_its_load_check_is_built_here_at_once(mount, s3, tmp_path):
    """Was EIO on every open.  Holds: SEMANTICS.md#changes-published"""
    files = {"a.jsonl": jsonl(2000, 7)}
    client = s3.client()
    upload(client, "forged3", files)
    assert publish(s3, "forged3", tmp_path / "publisher").returncode == 0
    forge_published(client, "forged3", files["a.jsonl"], lambda b, d: b[:-1])  # records end before the file
    m = s3_mount(mount, s3, *ARGS, prefix="forged3")
    local = mount(None, *ARGS, src=write_tree(tmp_path / "local", files), name="local")
    for epoch in range(3):
        m.set_epoch(epoch)
        local.set_epoch(epoch)
        assert m.path("a.jsonl").read_bytes() == local.path("a.jsonl").read_bytes()
    assert m.stats()["errors"] == 0 and m.stats()["store_requests"]["index_built"] == 1
    assert os.path.exists(m.path("a.jsonl"))


@pytest.mark.parametrize("forgery", sorted(FORGED_TAR))
def test_a_forged_tar_index_in_a_bucket_is_eio_before_any_wrong_sample_is_served(mount, s3, tmp_path, forgery):
    """The halves of a cut sample in different windows (each window's neighbours come with its
    records), or a directory moved to the sample before it: EIO, every sample served before it
    whole, then the object's own index, as on local disk.
    Holds: SEMANTICS.md#changes-framing-tar, SEMANTICS.md#changes-published"""
    files = {"w.tar": wds_bytes(300)}
    change, reason = FORGED_TAR[forgery]
    if change is None:
        def apart(index, first: int) -> bool:
            plan = make_plan(index, SPEC, 0)
            return window_of(plan, first + 1) != window_of(plan, first)
        change = cut_at(forged_halves(files["w.tar"], 8192, apart))
    prefix = f"tar-{forgery}"
    client = s3.client()
    upload(client, prefix, files)
    assert publish(s3, prefix, tmp_path / "publisher").returncode == 0
    forge_published(client, prefix, files["w.tar"], change)
    m = s3_mount(mount, s3, *ARGS, prefix=prefix)
    local = mount(None, *ARGS, src=write_tree(tmp_path / "local", files), name="local")
    served_whole(m, ["w.tar"], files, reason)
    assert m.path("w.tar").read_bytes() == local.path("w.tar").read_bytes()
    assert m.stats()["store_requests"]["index_built"] == 1


def test_a_forged_tar_index_under_a_stage_in_front_of_a_bucket(mount, s3, tmp_path):
    """``--stage-dir`` over the bucket: the stage holds one half of a cut sample, whose
    neighbour in the object is fetched: EIO, then the object's own index.
    Holds: SEMANTICS.md#changes-framing-tar"""
    files = {"w.tar": wds_bytes(300)}

    def apart(index, first: int) -> bool:
        held = set(pls_exchange(index.body(), PLS_SPEC, 2).partition(1, 0).tolist())
        return (first in held) != (first + 1 in held)

    client = s3.client()
    upload(client, "tar-stage", files)
    assert publish(s3, "tar-stage", tmp_path / "publisher").returncode == 0
    forge_published(client, "tar-stage", files["w.tar"], cut_at(forged_halves(files["w.tar"], 4096, apart)))
    m = s3_mount(mount, s3, *PLS, "--stage-dir", str(tmp_path / "stage"), prefix="tar-stage")
    local = mount(None, *PLS, src=write_tree(tmp_path / "local", files), name="local")
    served_whole(m, ["w.tar"], files, "same sample key")
    assert m.path("w.tar").read_bytes() == local.path("w.tar").read_bytes()
