"""Level: mounted (real FUSE mounts, real readers).

Options out of range are usage errors (exit 2, a message naming the option) before anything
mounts, on the command line and in a config file; epochs out of range are EINVAL on the mount."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from conftest import REPO
from shufflefs.config import MAX_EPOCH


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shufflefs", *args], capture_output=True, text=True, env=env,
                          timeout=60, stdin=subprocess.DEVNULL)


BAD = [
    (["--block-size", "9999999TiB"], "--block-size"),
    (["--block-size", "1"], "--block-size"),
    (["--page-size", "3"], "--page-size"),
    (["--page-size", "3000"], "power of two"),
    (["--buffer", "0.0001%"], "--buffer"),
    (["--buffer", "10"], "--buffer"),
    (["--seed", "1" * 23], "--seed"),
    (["--epoch", str(MAX_EPOCH + 1)], "--epoch"),
    (["--world-size", str(2**40)], "--world-size"),
    (["--record-size", "2GiB"], "--record-size"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_nonsense_options_are_usage_errors(tmp_path, args, message):
    """Holds: SEMANTICS.md#epochs-values"""
    (tmp_path / "src").mkdir()
    (tmp_path / "mnt").mkdir()
    r = run("mount", str(tmp_path / "src"), str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c"), *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_an_unknown_source_scheme_is_a_usage_error(tmp_path):
    (tmp_path / "mnt").mkdir()
    log = tmp_path / "log"
    r = run("mount", "nosuch://bucket/prefix", str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c"),
            "--log-file", str(log))
    assert r.returncode == 2, r.stderr
    assert "unknown scheme nosuch://" in r.stderr and "Traceback" not in r.stderr
    assert not os.listdir(tmp_path / "mnt")


@pytest.mark.parametrize("args,message", BAD[:8], ids=[" ".join(a) for a, _ in BAD[:8]])
def test_nonsense_in_a_config_file_is_a_usage_error(tmp_path, args, message):
    (tmp_path / "src").mkdir()
    (tmp_path / "mnt").mkdir()
    key = args[0][2:].replace("-", "_")
    value = args[1]
    (tmp_path / "c.toml").write_text(f'{key} = "{value}"\n' if not value.isdigit() else f"{key} = {value}\n")
    r = run("mount", str(tmp_path / "src"), str(tmp_path / "mnt"), "--config", str(tmp_path / "c.toml"))
    assert r.returncode == 2, r.stderr


def test_epochs_beyond_the_range_are_einval_and_the_range_end_works(mount):
    """Holds: SEMANTICS.md#epochs-values, SEMANTICS.md#errors-einval"""
    m = mount({"a.jsonl": b"".join(b"%d\n" % i for i in range(1000))})
    for bad in (str(MAX_EPOCH + 1), "999999999999999999", "-1", "1e3"):
        with pytest.raises(OSError) as e:
            m.set_epoch(bad)
        assert e.value.errno == errno.EINVAL
    m.set_epoch(MAX_EPOCH)
    assert sorted(open(m.path("a.jsonl"), "rb").read().split()) == sorted(b"%d" % i for i in range(1000))
    r = run("epoch", str(m.mnt), "next")
    assert r.returncode == 2 and "invalid epoch" in r.stderr


def test_a_directory_reads_back_its_own_epoch_and_next_moves_it_forward(mount):
    """Holds: SEMANTICS.md#epochs-dir, SEMANTICS.md#epochs-read, SEMANTICS.md#epochs-next"""
    m = mount({"d/a.jsonl": b"x\n" * 10, "b.jsonl": b"y\n" * 10})
    m.set_epoch(5)
    assert run("epoch", str(m.path("d")), "9").returncode == 0
    assert run("epoch", str(m.path("d"))).stdout.strip() == "9"
    assert m.xattr("epoch", "d/a.jsonl") == "9"
    r = run("epoch", str(m.path("d")), "next")
    assert r.returncode == 0 and r.stdout.strip() == "10"
    assert m.xattr("epoch", "d/a.jsonl") == "10"
    assert m.xattr("epoch", "b.jsonl") == "5"
    assert run("epoch", str(m.mnt)).stdout.strip() == "5"


def test_stats_stay_readable_after_thousands_of_epochs(mount):
    m = mount({"a.jsonl": b"".join(b"%d\n" % i for i in range(200))})
    for epoch in range(2000):
        m.set_epoch(epoch)
        with open(m.path("a.jsonl"), "rb") as f:  # every epoch reads source bytes
            f.read(1)
    stats = m.stats()
    assert len(stats["read_bytes"]) <= 65  # the last epochs one by one, the others summed
    assert stats["read_bytes"]["1999"]["source_bytes"] > 0 and stats["read_bytes"]["earlier"]["source_bytes"] > 0
    assert run("stat", str(m.mnt)).returncode == 0


def test_stats_json_is_cut_to_fit_an_attribute():
    from shufflefs.serve.stats import STATS_LIMIT, fit

    big = {"epoch_overrides": {f"dir/file-{i:06d}.jsonl": i for i in range(20000)}, "errors": 3,
           "last_errors": ["x" * 400] * 20}
    data = fit(big)
    assert len(data) <= STATS_LIMIT
    import json

    out = json.loads(data)
    assert out["errors"] == 3 and "epoch_overrides" in out["truncated"]
