#!/usr/bin/env python3
"""Requests and bytes per epoch per rank on object storage, for a thousand ranks, and what an
epoch costs at given request and transfer prices.  No mounts, no data: a block summary.

    python tools/bench.py --only s3-costs [--world 1000] [--records 1e9] [--record-bytes 1KiB] [--block-size auto]
                             [--buffer 64MiB] [--objects 10000] [--exchange 0.1] [--sample 8]
                             [--check-records 2e6] [--get-price 0.0004] [--list-price 0.005]
                             [--transfer-price 0]

Per strategy, the ranged GETs a mount of rank r makes for its windows of one epoch, counted the
way the views ask for them: each window's runs through `sources.objects.plan_requests` (runs less
than 16 KiB apart share a request, a request is at most 8 MiB), and the bytes those requests
fetch; the mean over ``--sample`` ranks spread over the world.

* ``none``, ``corgipile``, ``stratified``: rank plans built on a seeded `BlockSummary` of
  ``--records`` records (O(blocks) each), counted exactly.
* ``full``: a rank's plan holds record ids (O(records)), so at full scale its requests come from a
  model: a record starts a request unless a record of the same window lies within 16 KiB before
  it (`per_record`: about one request per record once windows are a small part of the data).
  The model is printed beside a count on a dataset of ``--check-records`` records.
* ``pls`` with ``--stage-dir``: the first epoch copies the rank's partition (its blocks, counted
  like ``none``); every later epoch fetches only the records the rank received (``--exchange`` of
  its partition), scattered over the other ranks' partitions: a request each, as ``full``'s
  (the stage holds the rest on local disk).

And per mount, once: LIST requests of the prefix (``--objects`` keys, 1,000 a page) and the
objects' indexes, either published (`shufflefs index --publish`: a GET of 8 bytes per record
per object) or built (every object downloaded by every node).  Prices are parameters, per 1,000
requests and per GB; the defaults are the public S3 Standard list prices for GET and LIST, and
no transfer charge (reads from compute in the bucket's region).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shufflefs.config import format_size, parse_size  # noqa: E402
from shufflefs.sources.objects import COALESCE_GAP, PART, plan_requests  # noqa: E402
from shufflefs.strategies import ShuffleSpec, make_plan  # noqa: E402
from shufflefs.strategies.base import object_block_size  # noqa: E402
from shufflefs.strategies.summary import BlockSummary  # noqa: E402
from shufflefs.windows.layout import id_runs  # noqa: E402

LIST_PAGE = 1000
"""Keys an S3 LIST answers per request."""
INDEX_BYTES_PER_RECORD = 8


@dataclass
class Epoch:
    """One rank's requests and bytes for one epoch of one strategy."""

    gets: float
    nbytes: float


def window_requests(plan, summary) -> Epoch:
    """A rank's epoch: every window's runs as the views ask for them."""
    gets = nbytes = 0
    for k in range(plan.n_windows):
        runs = plan.window_runs(k)
        first, count = (np.asarray(a, np.int64) for a in (runs if runs is not None else id_runs(plan.window(k))))
        if not len(first):
            continue
        starts = summary.record_starts(first)
        ends = summary.record_starts(first + count - 1) + summary.record_lengths(first + count - 1)
        req = plan_requests(starts, ends)
        gets += len(req.start)
        nbytes += int((req.end - req.start).sum())
    return Epoch(gets, nbytes)


def per_record(window: int, records: int, record_bytes: int) -> float:
    """Requests per record of a record-level window of ``window`` records drawn from
    ``records``: a record starts a request unless the previous one of the window (in source order)
    ends less than `COALESCE_GAP` bytes before it, i.e. unless one of the ``gap / record_bytes``
    records before it is in the window."""
    density = min(1.0, window / max(records, 1))
    near = COALESCE_GAP / max(record_bytes, 1)
    return float((1.0 - density) ** near)


def sample_ranks(world: int, sample: int) -> list[int]:
    return sorted({int(r) for r in np.linspace(0, world - 1, min(sample, world))})


def mean_epoch(summary, spec: ShuffleSpec, world: int, ranks: list[int], epoch: int = 1) -> Epoch:
    got = [window_requests(make_plan(summary, spec, epoch, r, world), summary) for r in ranks]
    return Epoch(float(np.mean([g.gets for g in got])), float(np.mean([g.nbytes for g in got])))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=1000)
    p.add_argument("--records", type=float, default=1e9)
    p.add_argument("--record-bytes", default="1KiB")
    p.add_argument("--block-size", default="auto",
                   help="the blocks' size (default auto: a bucket's default for --buffer, `object_block_size`)")
    p.add_argument("--buffer", default="64MiB")
    p.add_argument("--objects", type=int, default=10_000, help="objects (shards) the records are stored in")
    p.add_argument("--exchange", type=float, default=0.1, help="pls: fraction of a partition traded per epoch")
    p.add_argument("--sample", type=int, default=8, help="ranks measured per strategy (spread over the world)")
    p.add_argument("--check-records", type=float, default=2e6, help="records of the dataset full is counted on")
    p.add_argument("--get-price", type=float, default=0.0004, help="USD per 1,000 GET requests")
    p.add_argument("--list-price", type=float, default=0.005, help="USD per 1,000 LIST requests")
    p.add_argument("--transfer-price", type=float, default=0.0, help="USD per GB transferred")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    n, rb = int(a.records), parse_size(a.record_bytes)
    block = object_block_size(parse_size(a.buffer)) if a.block_size == "auto" else parse_size(a.block_size)
    summary = BlockSummary.synthetic(n, block, rb)
    spec = dict(seed=0, block_size=block, buffer=parse_size(a.buffer))
    ranks = sample_ranks(a.world, a.sample)
    rows: dict[str, Epoch] = {}
    for strategy in ("none", "corgipile", "stratified"):
        rows[strategy] = mean_epoch(summary, ShuffleSpec(strategy=strategy, **spec), a.world, ranks)
    # full: measured on a smaller dataset, against the model used at full scale
    m = int(a.check_records)
    small = BlockSummary.synthetic(m, block, rb)
    measured = mean_epoch(small, ShuffleSpec(strategy="full", **spec), a.world, ranks[:2])
    share_small = m / a.world
    window = max(1, parse_size(a.buffer) // rb)  # records a window holds: the buffer's, or the whole share
    model_small = per_record(min(window, m // a.world), m, rb)
    per_req = per_record(min(window, n // a.world), n, rb)
    rows["full"] = Epoch(n / a.world * per_req, n / a.world * rb)
    received = a.exchange * n / a.world
    rows["pls, staged (later epochs)"] = Epoch(received * per_req, received * rb)
    rows["pls, staged (first epoch)"] = rows["none"]
    check = (f"full at {m:.3g} records: {measured.gets / share_small:.3f} requests per record measured, "
             f"{model_small:.3f} modelled; at {n:.3g} records the model gives {per_req:.4f}")

    lists = -(-a.objects // LIST_PAGE)
    published = Epoch(a.objects + lists, n * INDEX_BYTES_PER_RECORD)
    per_object = summary.data_bytes / a.objects  # downloaded in parts of at most `PART` bytes
    built = Epoch(a.objects * max(1, -(-int(per_object) // PART)) + lists, summary.data_bytes)
    title = (f"{a.world} ranks, {n:.3g} records of ~{format_size(rb)} ({format_size(summary.data_bytes)}) in "
             f"{a.objects:,} objects, blocks {format_size(block)}, buffer {a.buffer}; ranks measured: {len(ranks)}")
    print(title + "\n\n" + check + "\n")
    print("| per rank, per epoch | GET requests | GB fetched | x data share | USD, all ranks |")
    print("|---|---:|---:|---:|---:|")
    share = summary.data_bytes / a.world
    for name, e in rows.items():
        usd = a.world * (e.gets / 1000 * a.get_price + e.nbytes / 1e9 * a.transfer_price)
        print(f"| {name} | {e.gets:,.0f} | {e.nbytes / 1e9:.3f} | {e.nbytes / share:.2f} | {usd:,.2f} |")
    print("\n| per mount, once | requests | GB fetched | USD, all ranks |")
    print("|---|---:|---:|---:|")
    for name, e in (("indexes published (`shufflefs index --publish`)", published), ("indexes built on every node", built)):
        usd = a.world * ((e.gets - lists) / 1000 * a.get_price + lists / 1000 * a.list_price + e.nbytes / 1e9 * a.transfer_price)
        print(f"| {name} (+{lists} LIST) | {e.gets:,.0f} | {e.nbytes / 1e9:,.3f} | {usd:,.2f} |")
    print(f"\nPrices: GET {a.get_price} and LIST {a.list_price} USD per 1,000 requests, transfer {a.transfer_price} USD per GB.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
