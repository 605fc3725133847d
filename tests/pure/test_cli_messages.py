"""Level: pure (no mount; the command line is run, nothing is mounted).

What the command line says when it refuses something, and its help, against what the code does:
short usage errors with a hint, suggestions for a unitless --buffer, cache-directory advice that
fits what was given, few-block lines worded by where the block size came from, setup.sh's
PyTorch line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shufflefs.cli.stat import format_stats

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)


def dirs(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "mnt").mkdir()
    return str(tmp_path / "src"), str(tmp_path / "mnt")


def test_a_usage_error_is_the_error_and_a_hint_not_the_usage_block(tmp_path):
    got = run("mount")
    assert got.returncode == 2 and "usage:" not in got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("shufflefs mount: error: "), got.stderr
    assert "shufflefs mount --help" in lines[1]
    src, mnt = dirs(tmp_path)
    got = run("mount", src, mnt, "--strategy", "nope")
    assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 2, got.stderr


def test_a_stage_wait_that_is_no_number_of_seconds_is_refused_with_the_range(tmp_path):
    src, mnt = dirs(tmp_path)
    for value in ("-1", "abc", "nan", "1e9"):
        got = run("mount", src, mnt, "--stage-wait", value)
        assert got.returncode == 2 and "argument --stage-wait" in got.stderr and "seconds" in got.stderr, got.stderr
        assert value == "abc" or "[0, 3600]" in got.stderr, got.stderr


def test_a_buffer_without_a_unit_suggests_a_share_or_mebibytes(tmp_path):
    src, mnt = dirs(tmp_path)
    got = run("mount", src, mnt, "--buffer", "10")
    assert got.returncode == 2 and "10%" in got.stderr and "10MiB" in got.stderr, got.stderr


def test_a_cache_dir_inside_the_source_is_worded_by_whether_it_was_given(tmp_path):
    src, mnt = dirs(tmp_path)
    got = run("mount", src, mnt, "--cache-dir", f"{src}/cache")
    assert got.returncode == 2 and "(use --cache-dir)" not in got.stderr
    assert "--cache-dir" in got.stderr and "choose a --cache-dir outside it" in got.stderr, got.stderr
    env = {"PATH": "/usr/bin:/bin", "HOME": src, "XDG_CACHE_HOME": f"{src}/.cache"}
    got = run("mount", src, mnt, env=env)
    assert got.returncode == 2 and "the default cache directory" in got.stderr, got.stderr
    assert "give a --cache-dir outside it" in got.stderr
    got = run("index", src, "--cache-dir", f"{src}/c")
    assert got.returncode == 2 and "choose a --cache-dir outside it" in got.stderr, got.stderr


def test_mount_help_says_even_none_counts_differ_by_at_most_one_record():
    got = run("mount", "--help")
    text = " ".join(got.stdout.split())
    assert got.returncode == 0 and "counts differ by at most one record" in text
    assert "dozens of blocks" not in text  # not true of files under 256 KiB


def test_few_block_lines_say_where_the_block_size_came_from():
    few = {"few_blocks": {"x.jsonl": 2}}
    s3 = format_stats({"source": "s3://bucket/p", "block_size": 4 << 20, "buffer": "64MiB", **few})
    assert "of 4MiB (the object-store default)" in s3 and "given" not in s3
    big = format_stats({"source": "s3://bucket/p", "block_size": 8 << 20, "buffer": "256MiB", **few})
    assert "of 8MiB (the object-store default)" in big
    given = format_stats({"source": "s3://bucket/p", "block_size": 8 << 20, "buffer": 64 << 20, **few})
    assert "of 8MiB:" in given and "object-store default" not in given
    auto = format_stats({"source": "/data", "block_size": "auto", **few})
    assert "of the automatic size" in auto and "--strategy full or once" in auto
    set_ = format_stats({"source": "/data", "block_size": 1 << 20, **few})
    assert "of 1MiB:" in set_ and "lower --block-size" in set_


def test_setup_sh_installs_the_torch_it_says():
    text = (REPO / "setup.sh").read_text()
    line = next(x for x in text.splitlines() if "pip install" in x and "torch" in x)
    assert "TORCH_SPEC" in line
    assert "The CPU build of PyTorch first" not in text and "PIP_EXTRA_INDEX_URL" in text
