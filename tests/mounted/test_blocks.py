"""Level: mounted (real FUSE mounts, real readers).

Mounted: the automatic block size shuffles every file, small ones too; a block size the user
set that leaves a file few blocks is named in the log and in `shufflefs stat`."""

from __future__ import annotations

import json

import pytest

from shufflefs.strategies.base import ShuffleSpec, effective_block_size

SMALL = b"".join(b'{"i": %05d}\n' % i for i in range(20000))  # 240 KB: one 4 MiB block


def test_the_automatic_block_is_a_power_of_two_from_a_page_to_4mib():
    spec = ShuffleSpec()
    assert effective_block_size(spec, 240_000) == 4096  # 1/64 is 3,750 bytes: one page at least
    assert effective_block_size(spec, 64 << 20) == 128 << 10  # the 64 MiB buffer / 512
    assert effective_block_size(spec, 1 << 40) == 128 << 10
    assert effective_block_size(spec, 4 << 20) == 64 << 10  # a file of 4 MiB keeps 64 blocks
    assert effective_block_size(ShuffleSpec(buffer=4 << 30), 1 << 40) == 4 << 20  # at most 4 MiB
    assert effective_block_size(ShuffleSpec(block_floor=1 << 20), 1 << 40) == 1 << 20  # a measured floor
    assert effective_block_size(spec, 10) == 4096
    assert effective_block_size(ShuffleSpec(block_size=12345), 10) == 12345


@pytest.mark.parametrize("strategy", ["block", "corgipile"])
def test_a_small_file_is_shuffled_by_default(mount, strategy):
    m = mount({"a.jsonl": SMALL}, "--strategy", strategy)
    got = open(m.path("a.jsonl"), "rb").read()
    assert sorted(got.splitlines()) == sorted(SMALL.splitlines())
    assert got != SMALL  # not source order
    info = json.loads(m.xattr("info", "a.jsonl"))
    assert info["block_size_auto"] and info["block_size"] == 4096 and info["blocks"] >= 50
    assert m.xattr("block_size", "a.jsonl") == "4096"


def test_pls_gives_no_rank_an_empty_view_of_a_small_file(mount):
    src = None
    seen = []
    for rank in range(4):
        m = mount({"a.jsonl": SMALL} if src is None else None, "--strategy", "pls", "--world-size", "4",
                  "--rank", str(rank), src=src, name=f"r{rank}")
        src = m.src
        seen.append(open(m.path("a.jsonl"), "rb").read().splitlines())
    assert [len(s) for s in seen] == [5000] * 4
    assert sorted(sum(seen, [])) == sorted(SMALL.splitlines())


def test_a_given_block_size_leaving_few_blocks_is_reported(mount):
    m = mount({"a.jsonl": SMALL, "big.jsonl": SMALL * 40}, "--block-size", "1MiB")
    open(m.path("a.jsonl"), "rb").read()
    open(m.path("big.jsonl"), "rb").read()
    few = m.stats()["few_blocks"]
    assert few == {"a.jsonl": 1}
    assert "a.jsonl: 1 block(s)" in m.stderr() and "big.jsonl: " not in m.stderr()


@pytest.mark.parametrize("strategy", ["window", "full", "lirs-page", "none"])
def test_a_tiny_buffer_does_not_make_every_record_a_window(mount, strategy):
    m = mount({"a.jsonl": SMALL}, "--strategy", strategy, "--buffer", "0.01%")
    got = open(m.path("a.jsonl"), "rb").read()
    assert sorted(got.splitlines()) == sorted(SMALL.splitlines())
    assert int(m.xattr("windows", "a.jsonl")) == 1  # windows group reads of at least 1 MiB
