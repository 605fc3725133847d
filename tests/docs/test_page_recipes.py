"""Level: mounted. Every page of the user guide and the getting-started page runs as written: one
test per page, with the small dataset that page's blocks expect written into a fresh directory,
the blocks run there in order, and every mount under it torn down after (``run_page``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from shufflefs.cli.demo import write_dataset
from tests.conftest import REPO
from tests.docs import data
from tests.docs.pages import link_examples, run_page, unmarked
from tests.docs.recipes import blocks

DOCS = REPO / "docs"
GUIDE = DOCS / "guide"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _lines(path: Path, ids: range, **fields: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": k, **fields, "text": "w " * (k % 9 + 1)}) + "\n" for k in ids))


def _mounting(cwd: Path) -> None:
    write_dataset(cwd / "data", n=2000)
    (cwd / "train.py").write_text(
        "import argparse, json\n"
        "p = argparse.ArgumentParser()\np.add_argument('--data')\na = p.parse_args()\n"
        "with open(a.data) as f:\n    ids = [json.loads(line)['id'] for line in f]\n"
        "print(f'{len(ids)} records, first ids {ids[:5]}')\n")


def _wiki(cwd: Path) -> None:
    for i in range(4):
        _lines(cwd / "wiki" / f"part-{i:05d}.jsonl", range(i * 1000, (i + 1) * 1000), part=i)
    _lines(cwd / "wiki" / "val.jsonl", range(200), part="val")


def _mixture(cwd: Path) -> None:
    toml = [b for b in blocks(GUIDE / "mixtures.md") if b.lang == "toml"]
    assert toml and toml[0].code.startswith("# pretrain.toml")
    (cwd / "pretrain.toml").write_text(toml[0].code)
    for source, sub, n in (("web", "", 6000), ("books", "", 800), ("code", "py/", 2000), ("math", "", 500)):
        _lines(cwd / "corpus" / source / f"{sub}part-00000.jsonl", range(n), source=source)


def _ranks(cwd: Path) -> None:
    link_examples(cwd)
    subprocess.run([sys.executable, "examples/ddp_train.py", "--generate", "data/train.jsonl", "--records", "2000"],
                   cwd=cwd, check=True, capture_output=True, timeout=120)


def _resume(cwd: Path) -> None:
    write_dataset(cwd / "data", n=2000)
    for i in range(2):
        _lines(cwd / "data" / f"part-{i:05d}.jsonl", range(i * 500, (i + 1) * 500), part=i)


def _bucket(cwd: Path) -> None:
    """Set up in the test: the local S3 server lives as long as the page runs."""


PAGES: dict[str, Callable[[Path], None]] = {
    "getting-started.md": lambda cwd: None,
    "guide/mounting.md": _mounting,
    "guide/strategies.md": lambda cwd: None,
    "guide/readers.md": lambda cwd: data.wds_shards(cwd / "imgs"),
    "guide/pools.md": _wiki,
    "guide/mixtures.md": _mixture,
    "guide/ranks.md": _ranks,
    "guide/resume.md": _resume,
    "guide/staging.md": lambda cwd: write_dataset(cwd / "data", n=2000),
    "guide/object-storage.md": _bucket,
    "guide/cluster.md": lambda cwd: None,
}
"""Each page of the guide (formats.md has its own test, ``test_guide_recipes.py``) and its data."""


def test_every_guide_page_is_tested_here() -> None:
    pages = {str(p.relative_to(DOCS)) for p in GUIDE.glob("*.md")}
    assert pages - {"guide/formats.md"} == {p for p in PAGES if p.startswith("guide/")}


@pytest.mark.parametrize("page", sorted(PAGES) + ["guide/formats.md"])
def test_every_block_runs_or_says_why(page: str) -> None:
    assert not [(b.line, b.lang) for b in unmarked(DOCS / page)], f"{page}: blocks that neither run nor say why"


def _env(cwd: Path) -> dict[str, str]:
    return {"HOME": str(cwd)}  # the index cache of each page's mounts in its own directory


@pytest.mark.parametrize("page", [p for p in sorted(PAGES) if p not in ("guide/object-storage.md",)])
def test_page_runs(page: str, tmp_path: Path) -> None:
    if page == "guide/ranks.md" and not TORCHRUN.exists():
        pytest.skip("torchrun is not installed next to this Python")
    if page == "guide/readers.md":
        pytest.importorskip("webdataset")
    PAGES[page](tmp_path)
    ran = [b for b in blocks(DOCS / page) if b.runs]
    printed = run_page(DOCS / page, tmp_path, _env(tmp_path))
    assert len(printed) == len(ran)
    if page == "guide/mounting.md":
        epochs = [line for line in printed[0].splitlines() if line.startswith("2000 records")]
        assert len(epochs) == 2 and epochs[0] != epochs[1]  # epoch 1 reads another order


def test_object_storage_page_runs(tmp_path: Path) -> None:
    pytest.importorskip("obstore")
    pytest.importorskip("moto")
    from tests.objstore import CREDENTIALS, S3Server

    (tmp_path / "s3").mkdir()
    server = S3Server(tmp_path / "s3").start()
    try:
        client = server.client()
        client.create_bucket(Bucket="my-bucket")
        for i in range(4):
            body = "".join(json.dumps({"id": k, "part": i}) + "\n" for k in range(i * 500, (i + 1) * 500))
            client.put_object(Bucket="my-bucket", Key=f"train/part-{i:05d}.jsonl", Body=body.encode())
        printed = run_page(GUIDE / "object-storage.md", tmp_path,
                           dict(CREDENTIALS, AWS_ENDPOINT_URL=server.endpoint, **_env(tmp_path)))
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="my-bucket", Prefix="train/.shufflefs/")["Contents"]]
    finally:
        server.stop()
    assert len(printed) == 1
    assert len(keys) >= 4  # the published indexes, one per part
    assert os.listdir(tmp_path / "mnt") == []  # unmounted


@pytest.mark.parametrize("page", sorted(PAGES) + ["guide/formats.md", "reference/config.md"])
def test_config_blocks_parse(page: str, tmp_path: Path) -> None:
    """YAML and TOML blocks are not run, but each parses as its language (a Kubernetes Job, a
    config file), and a TOML block is a config file the mount accepts."""
    import tomllib

    from shufflefs.cli.options import read_config

    for b in blocks(DOCS / page):
        if b.lang == "yaml":
            yaml = pytest.importorskip("yaml")
            assert isinstance(yaml.safe_load(b.code), dict), f"{page}:{b.line}"
        elif b.lang == "toml":
            tomllib.loads(b.code)
            cfg = tmp_path / f"line{b.line}.toml"
            cfg.write_text(b.code)
            read_config(cfg)
