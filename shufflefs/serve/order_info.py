"""What decides a view's order, and how well it mixes, for ``user.shufflefs.info``: the effective
block size and buffer (two mounts give the same bytes only where these match: per file under
``--block-size auto``, and on object storage the buffer's `object_block_size`), and the label mix the epoch's order really
gives a sorted file (`strategies.base.order_label_mix`), measured once per plan on a worker."""

from __future__ import annotations

import weakref
from typing import Any

from ..strategies.base import (
    AUTO_BLOCK_FLOOR,
    AUTO_BLOCK_MAX,
    AUTO_BLOCKS,
    AUTO_BUFFER_BLOCKS,
    BLOCK_STRATEGIES,
    MIX_ASSUMPTION,
    OBJECT_BLOCK_MAX,
    OBJECT_BLOCK_MIN,
    OBJECT_BUFFER_BLOCKS,
    ORDER_MIX_FOR,
    RUNS_MIX_FOR,
    Plan,
    ShuffleSpec,
    buffer_label_mix,
    floored,
    object_block_size,
    order_label_mix,
)
from .catalog import Catalog
from .nodes import Node

_MIXES: "weakref.WeakKeyDictionary[Plan, dict]" = weakref.WeakKeyDictionary()
"""Label mixes measured, by plan (getfattr asks twice: for the size, then the value)."""


def block_size_from(spec: ShuffleSpec, source: str, index_floor: int = 0) -> str:
    """Where the effective block size comes from, in words a user can compare across nodes
    (``index_floor``: the file's own floor, a compressed file's)."""
    if spec.block_size is None:
        floor = max(spec.block_floor or AUTO_BLOCK_FLOOR, index_floor)
        origin = ("a restart interval of the compressed file" if index_floor > (spec.block_floor or AUTO_BLOCK_FLOOR)
                  else "a ranged GET's least, on object storage" if spec.block_floor and "://" in source
                  else "as 'shufflefs advise' measured this device" if spec.block_floor else "the default floor")
        return (f"auto: the buffer / {AUTO_BUFFER_BLOCKS} as a power of two, at least {floor >> 10} KiB ({origin}), "
                f"at most {AUTO_BLOCK_MAX >> 20} MiB and 1/{AUTO_BLOCKS} of the record bytes, at least a page")
    if "://" in source and isinstance(spec.buffer, int) and spec.block_size == object_block_size(spec.buffer):
        return (f"the object-store default ({spec.block_size >> 20} MiB: the buffer / {OBJECT_BUFFER_BLOCKS}, "
                f"{OBJECT_BLOCK_MIN >> 20} to {OBJECT_BLOCK_MAX >> 20} MiB), or --block-size {spec.block_size >> 20}MiB")
    return "--block-size"


def _measure(plan: Plan, runs: bool) -> dict:
    got = _MIXES.get(plan)
    if got is None:
        got = {"sorted": order_label_mix(plan)}
        if runs:
            got["runs"] = order_label_mix(plan, runs=True)
        _MIXES[plan] = got
    return got


async def fields(cat: Catalog, node: Node, plan: Plan) -> dict[str, Any]:
    """The effective block size and buffer, and the label mixes, of a planned view."""
    spec = cat.spec
    data_bytes = int(plan.index.data_bytes)
    out: dict[str, Any] = {
        "block_size": plan.spec.block_size,
        "block_size_from": block_size_from(spec, str(cat.source), getattr(plan.index, "block_floor", 0)),
        "buffer_bytes": spec.buffer_bytes(max(1, data_bytes)),
    }
    if spec.strategy in BLOCK_STRATEGIES and data_bytes > 0:
        blocks, mix = buffer_label_mix(floored(spec, plan.index), data_bytes, node.parts)
        out.update(blocks_per_buffer=blocks, buffer_label_mix=round(mix, 3), buffer_label_mix_for=MIX_ASSUMPTION)
    got = await cat.workers.run(_measure, plan, spec.strategy == "stratified", limiter=cat.workers.plan)
    out.update(expected_label_mix=round(got["sorted"]["mix"], 3), expected_label_mix_for=ORDER_MIX_FOR,
               uniform_label_mix=round(got["sorted"]["uniform"], 3), label_mix_records=got["sorted"]["records"])
    if "runs" in got:
        out.update(expected_label_mix_runs=round(got["runs"]["mix"], 3), expected_label_mix_runs_for=RUNS_MIX_FOR)
    return out
