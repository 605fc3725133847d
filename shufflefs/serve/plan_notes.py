"""What planning finds worth telling the user once per file or pool (too few blocks, buffers of
few blocks), and the checks a pool's files must pass before they are joined."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ..errors import FormatError
from ..formats.npy import row_kind
from ..index.table import RecordIndex
from ..sources.base import Store
from ..strategies.base import (
    BLOCK_ORDERS,
    BLOCK_STRATEGIES,
    BUFFER_ORDERS,
    BUFFER_BLOCKS,
    FEW_BLOCKS,
    MIX_ASSUMPTION,
    ShuffleSpec,
    buffer_label_mix,
    effective_block_size,
    floored,
)

log = logging.getLogger("shufflefs")

EFFECTIVE_NAMES = 100_000
"""Files (or pools) whose effective block size and buffer are kept for ``shufflefs stat``."""


class PlanNotes:
    """Files (or pools) of few blocks and of buffers of few blocks, each warned about once and
    shown by ``shufflefs stat``."""

    def __init__(self, spec: ShuffleSpec) -> None:
        self.spec = spec
        self.few_blocks: dict[str, int] = {}  # files with fewer than FEW_BLOCKS of a size the user set
        self.small_buffers: dict[str, dict] = {}  # files whose buffer holds fewer than BUFFER_BLOCKS blocks
        self.effective: dict[str, tuple[int | None, int]] = {}  # file -> (block size, buffer bytes) of its order
        self._buffers_checked: set[tuple[str, int, int]] = set()  # (file, bytes, parts) whose buffer was checked

    def note(self, name: str, index: RecordIndex, parts: int = 1) -> None:
        self._few_blocks(name, index)
        self._small_buffer(name, index, parts)
        if self.spec.strategy in BUFFER_ORDERS and name not in self.effective and len(self.effective) < EFFECTIVE_NAMES:
            spec = floored(self.spec, index)
            block = effective_block_size(spec, index.data_bytes) if self.spec.strategy in BLOCK_ORDERS else None
            self.effective[name] = (block, self.spec.buffer_bytes(max(1, index.data_bytes)))

    def effective_counts(self) -> list[dict]:
        """The block sizes and buffers the files planned so far are shuffled with, and how many
        files each (the block size is per file under ``--block-size auto``): what two nodes must
        share to show the same bytes."""
        counts = Counter(self.effective.values())
        return [{"block_size": b, "buffer_bytes": f, "files": n} for (b, f), n in counts.most_common()]

    def _few_blocks(self, name: str, index: RecordIndex) -> None:
        """A file (or pool) of fewer than `FEW_BLOCKS` blocks, which block orders barely shuffle:
        say so once (a warning for a size the user set, an info line for the automatic size,
        whose floor of a page leaves every file under 8 pages few blocks)."""
        if self.spec.strategy not in (*BLOCK_STRATEGIES, "pls") or index.data_bytes <= 0:
            return
        size = effective_block_size(floored(self.spec, index), index.data_bytes)
        blocks = -(-index.data_bytes // size)
        if blocks >= FEW_BLOCKS or name in self.few_blocks:
            return
        if len(self.few_blocks) < 1000:
            self.few_blocks[name] = blocks
        given = self.spec.block_size is not None
        log.log(logging.WARNING if given else logging.INFO,
                "%s: %d block(s) of %d bytes: fewer than %d blocks, so block orders barely shuffle it%s", name,
                blocks, size, FEW_BLOCKS, "; lower --block-size" if given else
                " (the automatic size is at least a page); use --strategy full or once for files this small")

    def _small_buffer(self, name: str, index: RecordIndex, parts: int) -> None:
        """A file (or pool) whose buffer holds fewer than `BUFFER_BLOCKS` of its blocks, so that
        block and corgipile mix few runs of one label: warn once, with the expected label mix."""
        key = (name, index.data_bytes, parts)
        if self.spec.strategy not in BLOCK_STRATEGIES or index.data_bytes <= 0 or name in self.small_buffers or (
                key in self._buffers_checked):
            return
        if len(self._buffers_checked) < EFFECTIVE_NAMES:  # every plan of a file asks: 3-6 ms each on 2 M rows
            self._buffers_checked.add(key)
        blocks, mix = buffer_label_mix(floored(self.spec, index), index.data_bytes, parts)
        if blocks >= BUFFER_BLOCKS or mix == 0.0:
            return
        if len(self.small_buffers) < 1000:
            self.small_buffers[name] = {"blocks_per_buffer": blocks, "expected_label_mix": round(mix, 3)}
        log.warning("%s: a buffer holds %d blocks (fewer than %d): expected label mix %.3f (TV %s; 0 is a "
                    "perfect mix); set --block-size smaller or --buffer larger", name, blocks, BUFFER_BLOCKS,
                    mix, MIX_ASSUMPTION)


def check_npy_pool(store: Store, pool: Any) -> None:
    """Blocking: arrays pool only if their rows are alike (the shards' headers are rewritten)."""
    kinds = []
    for m in pool.members:
        f = store.open_file(m)
        try:
            head = f.read(0, 1 << 16)
        finally:
            f.close()
        path = store.path(m)
        kinds.append((row_kind(head, path), path))
    for kind, path in kinds[1:]:
        if kind != kinds[0][0]:
            raise FormatError(path, 0, f"rows {kind} differ from those of {kinds[0][1]} {kinds[0][0]}; "
                              "arrays pool only with rows of one dtype and shape (--no-pool shuffles each file alone)")


def check_headers(store: Store, pool: Any, members: list[RecordIndex]) -> None:
    """Blocking: a mixture's shards show its first file's header (a CSV's column names), so
    every file's must be the same bytes."""
    first = None
    for m, idx in zip(pool.members, members):
        f = store.open_file(m)
        try:
            head = f.read(0, idx.header_end) if idx.header_end else b""
        finally:
            f.close()
        if first is None:
            first = (head, m)
        elif head != first[0]:
            raise FormatError(store.path(m), 0, f"its header differs from that of {store.path(first[1])}; "
                              "the files of a mixture must have the same header")
