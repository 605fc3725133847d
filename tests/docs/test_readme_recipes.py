"""Level: mounted. The README's recipes run as written, in order, on generated data, through real
mounts (the S3 one against a local moto server, the DDP one with torchrun on CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shufflefs.cli.demo import write_dataset
from tests.conftest import REPO
from tests.docs import data
from tests.docs.pages import link_examples, run_page, unmarked

README = REPO / "README.md"


def test_every_readme_block_runs_or_says_why() -> None:
    assert not [(b.line, b.lang) for b in unmarked(README)]


@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed next to this Python")
def test_readme_recipes(tmp_path: Path) -> None:
    pytest.importorskip("webdataset")
    pytest.importorskip("obstore")
    from tests.objstore import CREDENTIALS, S3Server

    write_dataset(tmp_path / "data", n=2000)
    data.corpus(tmp_path / "corpus")
    data.wds_shards(tmp_path / "imgs")
    link_examples(tmp_path)
    (tmp_path / "s3").mkdir()
    server = S3Server(tmp_path / "s3").start()
    try:
        client = server.client()
        client.create_bucket(Bucket="my-bucket")
        client.put_object(Bucket="my-bucket", Key="train/train.jsonl", Body=(tmp_path / "data" / "train.jsonl").read_bytes())
        env = dict(CREDENTIALS, AWS_ENDPOINT_URL=server.endpoint, HOME=str(tmp_path))
        printed = run_page(README, tmp_path, env)
    finally:
        server.stop()
    quick = [line for line in printed[0].splitlines() if line.startswith('{"id"')]
    assert len(quick) == 6 and quick[0:3] != quick[3:6]  # epoch 1 shows another order than epoch 0
