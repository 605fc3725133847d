"""The default view of a label-sorted object mixes within 2x of a uniform shuffle: a bucket mount
with no --block-size and no --buffer (a SeaweedFS S3 server, `tools/s3_link.EmulatedBucket`, with
a short round trip and no rate cap) cuts a 256 MiB object of 10 labels in order into blocks of the
buffer / 16, so every 64 MiB buffer draws from 16 stretches of it.  The label mix is measured by
`quality.metrics.label_mix_tv` on the records in the order the view delivers them.  Timings are
measured by ``tools/bench.py --only s3-blocks``, not asserted here."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("boto3")

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from bench.data import make_lines  # noqa: E402
from s3_link import EmulatedBucket, missing  # noqa: E402

from shufflefs.quality.metrics import LABEL_TV, label_mix_tv, uniform_reference  # noqa: E402

if missing() is not None:
    pytest.skip(f"emulated bucket: {missing()}", allow_module_level=True)

BUCKET = "data"
SIZE = 256 << 20
ENV = {"AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", "AWS_DEFAULT_REGION": "us-east-1"}
LINE = re.compile(rb'^\{"id": (\d+), "label": (\d+)', re.M)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("sorted")
    make_lines(work / "sorted.jsonl", SIZE)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ENV.items():
            mp.setenv(k, v)
        with EmulatedBucket(work / "server", 0.002, 2e9, None, (BUCKET,)) as b:
            b.put(BUCKET, "ds/sorted.jsonl", (work / "sorted.jsonl").read_bytes())
            yield b


def read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        chunks = []
        while chunk := f.read(1 << 20):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_default_view_of_a_label_sorted_object_mixes_within_2x_of_uniform_and_holds_every_record_once(
        mount, bucket):
    """Holds: SEMANTICS.md#views-object-default-mix"""
    m = mount(None, "--endpoint-url", bucket.endpoint, src=f"s3://{BUCKET}/ds", name="sorted")
    info = json.loads(m.xattr("info", "sorted.jsonl"))
    assert info["strategy"] == "stratified" and info["block_size"] == 4 << 20 and info["blocks_per_buffer"] == 16
    assert "object-store default" in info["block_size_from"]
    for epoch in (0, 1):
        m.set_epoch(epoch)
        view = read(m.path("sorted.jsonl"))
        pairs = np.array(LINE.findall(view), dtype=np.int64)
        ids, labels = pairs[:, 0], pairs[:, 1]
        assert len(ids) == view.count(b"\n") and np.array_equal(np.sort(ids), np.arange(len(ids)))  # each once
        assert np.array_equal(np.bincount(labels), np.bincount(labels[np.argsort(ids)]))
        assert (np.diff(labels[np.argsort(ids)]) >= 0).all()  # the object is sorted by label
        order = np.arange(len(ids))
        mix, uniform = label_mix_tv(order, labels, 100), uniform_reference(len(ids), labels, k=100)[LABEL_TV]
        assert mix <= 2 * uniform, (epoch, mix, uniform)
        in_source_order = label_mix_tv(np.argsort(ids), labels, 100)
        assert in_source_order > 0.8  # what an unshuffled read of it scores
    gets = m.stats()["read_bytes"]["1"]["source_requests"]
    assert gets <= 1.1 * SIZE / (4 << 20)  # a GET per block, not per part of one
