"""What a buffer gives on object storage (``shufflefs advise s3://BUCKET/PREFIX [--buffer SIZE]``).

On a bucket ``--block-size auto`` is `strategies.base.object_block_size` of the buffer, one ranged
GET per block, so the buffer sets three things at once, and this module states them without
reading the bucket:

* the label mix: the default view (``stratified``) of a label-sorted object much larger than the
  buffer, per 100 records, beside a uniform shuffle's.  A buffer's own deviation
  (`quality.expected_stratified_mix_tv`) and 100 records' sampling noise are combined as
  independent errors, sqrt(buffer^2 + uniform^2): measured through mounts over an emulated link
  (docs/benchmark.md, `tools/bench.py --only s3-blocks`) 0.143/0.186/0.311 against this model's
  0.138/0.202/0.308 for 32/16/8 blocks per buffer;
* the reading rate the link allows: a GET of ``b`` bytes takes a round trip plus ``b`` over one
  connection's rate, so ``requests`` in flight deliver at most ``requests x b / (rtt + b /
  conn_rate)``, and never more than the link;
* the requests: GETs per GiB read and what they cost at a GET's list price.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quality.metrics import expected_block_mix_tv, expected_stratified_mix_tv
from ..strategies.base import MIX_LABELS, OBJECT_BLOCK_MAX, OBJECT_BLOCK_MIN, OBJECT_BUFFER_BLOCKS, object_block_size

GiB = 1 << 30
MIX_RECORDS = 100
"""Records per window of the label mix (what ``shufflefs inspect`` reports by default)."""
FILE_BLOCKS = 4096
"""Blocks of the label-sorted file the mix is stated for: the expected mix no longer changes with
the file's size from a few dozen buffers on."""
GET_PRICE = 0.0004 / 1000
"""USD per GET request: the S3 Standard list price (0.0004 USD per 1,000 GETs, us-east-1)."""
RTT, CONN_RATE, LINK_RATE = 0.030, 80e6, 400e6
"""The link assumed unless given: 30 ms round trips, 80 MB/s per connection, 400 MB/s in all (a
bucket in the same region, as `tools/s3_link.py` emulates it)."""


@dataclass(frozen=True)
class ObjectAdvice:
    buffer: int
    block_size: int
    blocks: int
    """Blocks per buffer."""
    mix: float
    uniform: float
    requests: int
    rate: float
    """Bytes a second the GETs in flight allow (at most the link's)."""
    link_rate: float
    gets_per_gib: float

    @property
    def usd_per_tib(self) -> float:
        """What the GETs of reading a TiB cost at `GET_PRICE`."""
        return self.gets_per_gib * 1024 * GET_PRICE


def view_mix(blocks: int, labels: int = MIX_LABELS, records: int = MIX_RECORDS) -> tuple[float, float]:
    """(the expected label mix per ``records`` records of a stratified buffer of ``blocks`` blocks
    over a label-sorted file, a uniform shuffle's)."""
    uniform = expected_block_mix_tv(records, labels)
    buffer = expected_stratified_mix_tv(max(FILE_BLOCKS, blocks), blocks, labels)
    return float((buffer ** 2 + uniform ** 2) ** 0.5), float(uniform)


def advise_objects(buffer: int, requests: int = 16, rtt: float = RTT, conn_rate: float = CONN_RATE,
                   link_rate: float = LINK_RATE, block_size: int | None = None) -> ObjectAdvice:
    """What ``buffer`` bytes of buffer give a mount of object storage (``block_size``: a
    ``--block-size`` given; None: the automatic one)."""
    block = object_block_size(buffer) if block_size is None else int(block_size)
    blocks = max(1, buffer // block)
    mix, uniform = view_mix(blocks)
    rate = min(link_rate, requests * block / (rtt + block / conn_rate))
    return ObjectAdvice(buffer, block, blocks, mix, uniform, requests, rate, link_rate, GiB / block)


def format_objects(advices: list[ObjectAdvice], rtt: float = RTT, conn_rate: float = CONN_RATE) -> str:
    """A table of buffers, with what each gives, and the assumptions it rests on."""
    head = (f"object storage: --block-size auto is the buffer / {OBJECT_BUFFER_BLOCKS}, {OBJECT_BLOCK_MIN >> 20} to "
            f"{OBJECT_BLOCK_MAX >> 20} MiB, one ranged GET each.  Label mix per {MIX_RECORDS} records of the default "
            f"view (stratified) of a label-sorted object, {MIX_LABELS} labels; a uniform shuffle scores "
            f"{advices[0].uniform:.3f}.  Rate: GETs in flight x block / ({rtt * 1e3:g} ms + block / "
            f"{conn_rate / 1e6:g} MB/s), at most the link ({advices[0].link_rate / 1e6:g} MB/s).  GETs at "
            f"{GET_PRICE * 1000:g} USD per 1,000.  The rate is the link's bound: the daemon's CPU may "
            "limit first (docs/benchmark.md, Object storage: block sizes over an emulated link).")
    rows = ["| --buffer | block | blocks / buffer | label mix | x uniform | --requests | MB/s | x link | GETs / GiB "
            "| USD / TiB read |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for a in advices:
        rows.append(f"| {_mib(a.buffer)} | {_mib(a.block_size)} | {a.blocks} | {a.mix:.3f} | {a.mix / a.uniform:.2f} | "
                    f"{a.requests} | {a.rate / 1e6:.0f} | {a.rate / a.link_rate:.2f} | {a.gets_per_gib:.0f} | "
                    f"{a.usd_per_tib:.2f} |")
    return "\n".join([head, "", *rows])


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g}MiB" if n < GiB else f"{n / GiB:g}GiB"


__all__ = ["GET_PRICE", "ObjectAdvice", "advise_objects", "format_objects", "view_mix"]
