"""Level: pure (no mount, no server).

The automatic block size on object storage (`strategies.base.object_block_size`): the buffer over
16, a power of two from 1 to 8 MiB, so that the default view of a label-sorted object mixes within
2x of a uniform shuffle with one ranged GET per block; what ``shufflefs mount`` makes of it, and
what ``shufflefs advise s3://...`` says a buffer gives."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shufflefs.advise.objects import GET_PRICE, advise_objects, view_mix
from shufflefs.cli import build_parser, mount_config
from shufflefs.strategies.base import (
    OBJECT_BLOCK,
    OBJECT_BLOCK_MAX,
    OBJECT_BLOCK_MIN,
    OBJECT_BUFFER_BLOCKS,
    ShuffleSpec,
    object_block_size,
)

MiB = 1 << 20


@given(buffer=st.integers(4096, 1 << 40))
def test_the_object_block_is_a_power_of_two_giving_a_buffer_16_blocks_where_it_can(buffer):
    block = object_block_size(buffer)
    assert block & (block - 1) == 0 and OBJECT_BLOCK_MIN <= block <= OBJECT_BLOCK_MAX
    blocks = buffer // block
    if OBJECT_BUFFER_BLOCKS * OBJECT_BLOCK_MIN <= buffer < 2 * OBJECT_BUFFER_BLOCKS * OBJECT_BLOCK_MAX:
        assert OBJECT_BUFFER_BLOCKS <= blocks < 2 * OBJECT_BUFFER_BLOCKS
    elif buffer < OBJECT_BUFFER_BLOCKS * OBJECT_BLOCK_MIN:
        assert block == OBJECT_BLOCK_MIN  # a small buffer: few blocks, but a GET still carries a MiB
    else:
        assert block == OBJECT_BLOCK_MAX and blocks >= 2 * OBJECT_BUFFER_BLOCKS


def test_the_default_buffer_takes_4mib_blocks_on_object_storage():
    assert object_block_size(ShuffleSpec().buffer_bytes(1)) == OBJECT_BLOCK == 4 * MiB
    assert [object_block_size(b * MiB) for b in (8, 16, 32, 64, 128, 1024)] == [MiB, MiB, 2 * MiB, 4 * MiB,
                                                                                8 * MiB, 8 * MiB]


def _spec(tmp_path, *argv: str) -> ShuffleSpec:
    parser, subs = build_parser()
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    args = parser.parse_args(["mount", *argv, str(mnt), "--cache-dir", str(tmp_path / "cache")])
    config, _ = mount_config(args, subs["mount"])
    return config.spec


def test_a_mount_of_a_bucket_takes_the_buffers_block_and_block_size_still_forces_one(tmp_path):
    assert _spec(tmp_path, "s3://bucket/p").block_size == 4 * MiB
    assert _spec(tmp_path, "s3://bucket/p", "--buffer", "128MiB").block_size == 8 * MiB
    assert _spec(tmp_path, "s3://bucket/p", "--buffer", "16MiB").block_size == MiB
    assert _spec(tmp_path, "s3://bucket/p", "--block-size", "8MiB").block_size == 8 * MiB
    assert _spec(tmp_path, "s3://bucket/p", "--block-size", "64KiB", "--buffer", "1GiB").block_size == 64 << 10
    share = _spec(tmp_path, "s3://bucket/p", "--buffer", "10%")  # per file, a GET of a MiB at least
    assert share.block_size is None and share.block_floor == OBJECT_BLOCK_MIN
    src = tmp_path / "src"
    src.mkdir()
    local = _spec(tmp_path, str(src))
    assert local.block_size is None and local.block_floor is None


def test_advice_for_a_bucket_mixes_within_2x_at_the_default_buffer_and_prices_the_gets():
    default = advise_objects(64 * MiB)
    assert (default.block_size, default.blocks, default.gets_per_gib) == (4 * MiB, 16, 256)
    assert default.mix <= 2 * default.uniform
    assert default.usd_per_tib == pytest.approx(256 * 1024 * GET_PRICE)
    eight = advise_objects(64 * MiB, block_size=8 * MiB)  # the former default: 8 blocks
    assert eight.mix > 2 * eight.uniform and eight.gets_per_gib == 128
    # the bound of the GETs in flight: one at a time waits a round trip per block
    one = advise_objects(64 * MiB, requests=1)
    assert one.rate == pytest.approx(4 * MiB / (0.030 + 4 * MiB / 80e6)) and one.rate < default.rate
    mixes = [view_mix(n)[0] for n in (4, 8, 16, 32, 64)]
    assert mixes == sorted(mixes, reverse=True)


def test_advise_of_a_bucket_states_each_buffer_without_a_request():
    out = subprocess.run([sys.executable, "-m", "shufflefs", "advise", "s3://no-such-bucket/p", "--buffer", "64MiB",
                          "--buffer", "1GiB"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| 64MiB") or ln.startswith("| 1GiB")]
    assert rows[0].startswith("| 64MiB | 4MiB | 16 |") and rows[1].startswith("| 1GiB | 8MiB | 128 |")
    bad = subprocess.run([sys.executable, "-m", "shufflefs", "advise", "s3://b/p", "--buffer", "lots"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--buffer" in bad.stderr
