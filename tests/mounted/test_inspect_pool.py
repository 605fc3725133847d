"""Level: mounted (real FUSE mounts, real readers).

`shufflefs inspect` of a pooled shard (numbered shards pool by default) measures that shard's
share of the pooled stream: the README's WebDataset recipe works as written."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO

pytest.importorskip("PIL.Image")
from test_mount_tar import ARGS, shard  # noqa: E402

SHARDS = 4


def inspect(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "shufflefs", "inspect", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def keys(path) -> list[str]:
    with tarfile.open(path) as t:
        return [m.name.rsplit(".", 1)[0] for m in t.getmembers() if m.name.endswith(".cls")]


@pytest.mark.parametrize("extra", [[], ["--world-size", "2", "--rank", "1"]])
def test_inspect_measures_a_pooled_shard_as_its_share_of_the_pool(mount, extra):
    m = mount({f"shard-{i:06d}.tar": shard(i, 50) for i in range(SHARDS)}, *ARGS, *extra)
    path = m.path("shard-000001.tar")
    info = json.loads(m.xattr("info", "shard-000001.tar"))
    assert info["pool_shards"] == SHARDS
    out = inspect(str(path), "--label-field", "cls", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    in_view = keys(path)
    assert report["records"] == len(in_view) == int(m.xattr("records", "shard-000001.tar"))
    assert set(report["labels"]) <= {str(i) for i in range(SHARDS)} and len(report["labels"]) > 1
    (name,) = report["strategies"]
    assert "shard 1/4" in name
    text = inspect(str(path), "--label-field", "cls")
    assert text.returncode == 0 and "shard 1/4" in text.stdout, text.stderr
    assert computed_keys(str(path), info) == in_view  # the order measured is the view's


def computed_keys(path: str, info: dict) -> list[str]:
    """The sample keys of the order inspect computes for a pooled shard, in that order."""
    from shufflefs.cli.inspect import _inspect_mounted, _order_of, _pooled_data
    from shufflefs.cli.parser import build_parser

    parser, subs = build_parser()
    got = _inspect_mounted(parser.parse_args(["inspect", path]), subs["inspect"], info)
    data = _pooled_data(got).tobytes()
    bounds = got.index.bounds
    (plan,) = got.plans.values()
    return [data[bounds[r]: bounds[r] + 100].split(b"\0", 1)[0].decode().rsplit(".", 1)[0]
            for r in _order_of(plan).tolist()]
