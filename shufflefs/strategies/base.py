"""What every shuffle strategy provides: a plan, i.e. the epoch's output order window by window."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..index.table import RecordIndex

MiB = 1 << 20
EVEN_MODES = ("none", "pad", "drop")
"""``ShuffleSpec.even``: every record once, or equal counts per rank by padding or dropping."""
LOCAL_MODES = ("uniform", "corgipile")
"""``ShuffleSpec.pls_local``: how a pls rank shuffles its partition."""


@dataclass(frozen=True)
class ShuffleSpec:
    """The user's choice of strategy and its parameters; identical on every rank and mount."""

    strategy: str = "stratified"
    seed: int = 0
    block_size: int | None = None
    """Bytes per block; None: automatic per file (`effective_block_size`)."""
    buffer: int | float = 64 * MiB
    """Bytes (int) or a fraction of the file's record bytes (float in (0, 1])."""
    page_size: int = 4096
    exchange: float = 0.0
    """Partial local shuffling: the fraction of every rank's records that moves to other ranks
    before each epoch (0: pure local shuffling, 1: everything moves)."""
    pls_local: str = "uniform"
    """Partial local shuffling: how a rank shuffles its partition, "uniform" or "corgipile"."""
    even: str = "none"
    """Equal record counts per rank: "none" (every record exactly once; counts may differ),
    "pad" (short ranks repeat some of their records) or "drop" (long ranks leave some out)."""
    balance: bool = False
    """Load-balanced ranks (``full`` only): the i-th record of every rank has a similar cost."""
    balance_field: str | None = None
    """The cost of a JSONL record for ``balance``: this numeric field (None: its byte length)."""
    random_level: float = 0.0
    """``balance``: seeded noise added to the costs before sorting, 0 (none) to 1 (their range)."""
    block_floor: int | None = None
    """The smallest automatic block size (None: `AUTO_BLOCK_FLOOR`); a mount sets it from the
    storage's measurement (`shufflefs advise`) when one is cached for the source's device."""

    def buffer_bytes(self, data_bytes: int) -> int:
        if isinstance(self.buffer, float):
            return max(1, int(round(self.buffer * data_bytes)))
        return max(1, int(self.buffer))


AUTO_BLOCK_MAX = 4 * MiB
AUTO_BLOCKS = 64
"""An automatic block is at most 1/AUTO_BLOCKS of a file's record bytes, so a file has dozens of
blocks to permute (a file of one block would be served in source order) unless it is smaller than
AUTO_BLOCKS pages: a block is never smaller than a page, and such files are reported."""
AUTO_BUFFER_BLOCKS = 512
"""An automatic block is at most 1/AUTO_BUFFER_BLOCKS of the buffer, so that a buffer draws from
hundreds of blocks: the label mix of a buffer of n one-label blocks falls only as 1/sqrt(n)
(`quality.expected_block_mix_tv`: 0.31 for 16 blocks, 0.053 for 512, against 0.037 for a uniform
shuffle's windows of 1,000 records over 10 labels)."""
AUTO_BLOCK_FLOOR = 128 << 10
"""The smallest automatic block where no measurement of the storage is saved (`shufflefs
advise`): a 64 MiB buffer then holds 512 blocks.  Measured on a 2-core VM (virtio disk, 8 MiB
readahead; `tools/cold_io.py`, retired, in git at 62680a3; 8 GiB file, 64 MiB windows, page cache dropped, 2026-11-25):
WILLNEED on a window's blocks then ascending preads, as views read, got 758/892/1370/2086/2033
MB/s for 16/32/64/128/256 KiB blocks against 1.9-2.5 GB/s for 0.5-4 MiB (0.96 of that at 128 KiB,
0.63 at 64 KiB); one pread at a time 153/280/403/892 MB/s at 16-128 KiB; 16-32 threads and
io_uring at depth 64 about the WILLNEED figures.  Through a mount, cold, 128 KiB to 4 MiB blocks
read alike (1.4-1.6 GB/s in paired rounds)."""
FEW_BLOCKS = 8
"""Below this many blocks, block and corgipile barely shuffle a file (reported for sizes the
user set)."""


def _pow2_floor(n: int) -> int:
    n = max(1, int(n))
    return 1 << (n.bit_length() - 1)


def effective_block_size(spec: ShuffleSpec, data_bytes: int) -> int:
    """The block size a file (or pool) of ``data_bytes`` record bytes is shuffled with: the
    user's, or the largest power of two at most the buffer over `AUTO_BUFFER_BLOCKS` but not
    below the storage's floor (``spec.block_floor``, else `AUTO_BLOCK_FLOOR`), nor above
    `AUTO_BLOCK_MAX` or ``data_bytes / AUTO_BLOCKS``; at least a page.

    A pure function of the spec and the file's size, so every rank computes the same blocks."""
    if spec.block_size is not None:
        return spec.block_size
    floor = spec.block_floor if spec.block_floor is not None else AUTO_BLOCK_FLOOR
    by_buffer = max(_pow2_floor(spec.buffer_bytes(data_bytes) // AUTO_BUFFER_BLOCKS), _pow2_floor(floor))
    size = min(by_buffer, AUTO_BLOCK_MAX, _pow2_floor(int(data_bytes) // AUTO_BLOCKS))
    return int(max(spec.page_size, size))


OBJECT_BUFFER_BLOCKS = 16
"""On object storage a ``--block-size auto`` block is the buffer over this many, so that a buffer
draws from 16 stretches of the file: a label-sorted object's default view then mixes within
1.6-1.7x of a uniform shuffle per 100 records (32 blocks: 1.1-1.3x, 8 blocks: 2.6-2.8x), and over
a 30 ms emulated link 4 MiB blocks read 1.23x as fast as 2 MiB ones with half the GETs
(`tools/bench.py --only s3-blocks`, docs/benchmark.md)."""
OBJECT_BLOCK_MIN = 1 * MiB
"""The smallest automatic block on object storage: a ranged GET costs a round trip (30 ms to a
bucket) and a price, so a GET carries at least a MiB (16 in flight then fill a 400 MB/s link)."""
OBJECT_BLOCK_MAX = 8 * MiB
"""The largest automatic block on object storage (a ranged GET's part, `sources.objects.PART`)."""


def object_block_size(buffer_bytes: int) -> int:
    """The block size of ``--block-size auto`` on object storage for a buffer of ``buffer_bytes``:
    the largest power of two at most the buffer over `OBJECT_BUFFER_BLOCKS`, between
    `OBJECT_BLOCK_MIN` and `OBJECT_BLOCK_MAX` (64 MiB: 4 MiB blocks, one GET each; 128 MiB and up:
    8 MiB).  Pure, of the buffer alone, so that every rank cuts the same blocks."""
    return int(min(max(_pow2_floor(int(buffer_bytes) // OBJECT_BUFFER_BLOCKS), OBJECT_BLOCK_MIN), OBJECT_BLOCK_MAX))


OBJECT_BLOCK = object_block_size(ShuffleSpec().buffer_bytes(1))
"""The default buffer's block on object storage (4 MiB)."""

BLOCK_STRATEGIES = ("block", "corgipile", "stratified")
"""The strategies whose windows are buffers of whole blocks: blocks per buffer set their mix."""
BLOCK_ORDERS = (*BLOCK_STRATEGIES, "pls")
"""The strategies whose order depends on the block size."""
BUFFER_ORDERS = (*BLOCK_ORDERS, "window")
"""The strategies whose order depends on the buffer."""
BUFFER_BLOCKS = 64
"""Below this many blocks per buffer, block and corgipile mix labels poorly (a warning)."""
MIX_LABELS = 10
"""The label count the expected label mix is stated for (the daemon does not know the labels)."""
MIX_ASSUMPTION = f"for {MIX_LABELS} equally common labels, fully sorted"
RUNS_ASSUMPTION = f"for {MIX_LABELS} equally common labels in one-label blocks, in random order"


def blocks_per_buffer(spec: ShuffleSpec, data_bytes: int, parts: int = 1) -> int:
    """Blocks in one buffer of a file (or pool) of ``data_bytes`` record bytes, as block and
    corgipile plans take them: a part's buffer bytes over the effective block size, at least 1."""
    buffer = max(1, spec.buffer_bytes(data_bytes) // max(1, parts))
    return max(1, buffer // effective_block_size(spec, data_bytes))


def buffer_label_mix(spec: ShuffleSpec, data_bytes: int, parts: int = 1) -> tuple[int, float]:
    """Blocks per buffer and the expected label mix of a buffer over a fully sorted file
    (`MIX_ASSUMPTION`): `quality.expected_block_mix_tv` for block and corgipile, whose random
    blocks make sorted and shuffled runs alike, `quality.expected_stratified_mix_tv` for
    stratified; 0 when one buffer holds every block of the file."""
    from ..quality.metrics import expected_block_mix_tv, expected_stratified_mix_tv

    n, blocks = _buffer_and_file_blocks(spec, data_bytes, parts)
    if n >= blocks:
        return n, 0.0
    if spec.strategy == "stratified":
        return n, expected_stratified_mix_tv(blocks, n, MIX_LABELS)
    return n, expected_block_mix_tv(n, MIX_LABELS)


def runs_label_mix(spec: ShuffleSpec, data_bytes: int, parts: int = 1) -> float:
    """The expected label mix of a buffer when the file's one-label blocks come in random order
    (`quality.expected_block_mix_tv`): what every block order gets from data without a trend,
    stratified included."""
    from ..quality.metrics import expected_block_mix_tv

    n, blocks = _buffer_and_file_blocks(spec, data_bytes, parts)
    return 0.0 if n >= blocks else expected_block_mix_tv(n, MIX_LABELS)


MIX_WINDOW = 1000
"""Records per stretch of the label mix a view reports (`order_label_mix`), as ``shufflefs
inspect --window 1000`` measures it (and ``shufflefs advise --target-mix`` targets it)."""
MIX_RECORDS = 1 << 21
"""A view's label mix is measured over its first whole windows until they hold this many records."""
ORDER_MIX_FOR = (f"label mix TV per {MIX_WINDOW:,} records of this view, for {MIX_LABELS} equally common labels "
                 "in source order (a sorted file), as 'shufflefs inspect --window 1000' measures it")
RUNS_MIX_FOR = (f"label mix TV per {MIX_WINDOW:,} records of this view, for {MIX_LABELS} equally common labels "
                "in one-label blocks in random order")


def order_label_mix(plan: "Plan", runs: bool = False, window: int = MIX_WINDOW,
                    most: int = MIX_RECORDS) -> dict[str, float | int]:
    """What the plan's order really gives a file whose records carry `MIX_LABELS` equally
    common labels in source order (record i of n: label ``i * L // n``), or with ``runs`` in
    one-label blocks in a seeded random order: `quality.label_mix_tv` per ``window`` records of
    the epoch's view, over its first windows until they hold ``most`` records; and what a uniform shuffle
    of those records is expected to get.  A file of one block under ``block`` is its source
    order, and scores so, where the mix of its one buffer would be 0."""
    from ..quality.metrics import expected_label_mix_tv, label_mix_tv

    got, taken = [], 0
    for k in range(plan.n_windows):
        if taken >= most:
            break
        ids = np.asarray(plan.window(k), dtype=np.int64)
        got.append(ids)
        taken += len(ids)
    ids = np.concatenate(got) if got else np.zeros(0, np.int64)
    n = max(1, int(plan.index.n))
    if runs:
        firsts = np.asarray(plan.index.unit_firsts(plan.spec.block_size), dtype=np.int64)
        blocks = max(1, len(firsts) - 1)
        block_label = rng(0, blocks, 0x6c61).permutation(blocks) * MIX_LABELS // blocks
        labels = block_label[np.clip(np.searchsorted(firsts, ids, side="right") - 1, 0, blocks - 1)]
    else:
        labels = ids * MIX_LABELS // n
    if len(ids) == 0:
        return {"mix": 0.0, "uniform": 0.0, "records": 0}
    mix = label_mix_tv(np.arange(len(ids)), labels, window)
    uniform = expected_label_mix_tv(np.bincount(labels, minlength=MIX_LABELS), window)
    return {"mix": float(mix), "uniform": float(uniform), "records": int(len(ids))}


def _buffer_and_file_blocks(spec: ShuffleSpec, data_bytes: int, parts: int) -> tuple[int, int]:
    return (blocks_per_buffer(spec, data_bytes, parts),
            -(-int(data_bytes) // effective_block_size(spec, data_bytes)))


def floored(spec: ShuffleSpec, index: RecordIndex) -> ShuffleSpec:
    """``spec`` with the floor of automatic blocks raised to the index's own
    (`RecordIndex.block_floor`: a compressed file's blocks span several of its restart points, so
    that reading one decodes little more than its bytes); a pure function of the file, so every
    rank takes the same."""
    floor = getattr(index, "block_floor", 0)
    if spec.block_size is not None or floor <= (spec.block_floor or AUTO_BLOCK_FLOOR):
        return spec
    return replace(spec, block_floor=floor)


def resolve_spec(spec: ShuffleSpec, index: RecordIndex) -> ShuffleSpec:
    """``spec`` with its block size fixed for ``index`` (unchanged if the user set one)."""
    if spec.block_size is not None:
        return spec
    return replace(spec, block_size=effective_block_size(floored(spec, index), index.data_bytes))


def rng(*key: int) -> np.random.Generator:
    """The one way strategies draw randomness: a pure function of its integer key."""
    return np.random.default_rng([int(k) for k in key])


class Plan(ABC):
    """The output order of one (file, spec, epoch, rank, world), produced a window at a time.

    Windows are the unit of prefetching: the view reads a whole window's records from the
    source and assembles its bytes while the previous window is being served.
    """

    name: ClassVar[str]
    help: ClassVar[str] = ""
    """One line for ``--help``: what the order is, and the published strategy it follows."""

    def __init__(self, index: RecordIndex, spec: ShuffleSpec, epoch: int, rank: int, world: int,
                 part: int = 0, parts: int = 1):
        if not (0 <= rank < world):
            raise ValueError(f"rank {rank} outside world size {world}")
        if not (0 <= part < parts):
            raise ValueError(f"part {part} outside 0..{parts - 1}")
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        self.index, self.epoch, self.rank, self.world = index, epoch, rank, world
        self.spec = resolve_spec(spec, index)
        self.part, self.parts = part, parts

    @property
    @abstractmethod
    def window_sizes(self) -> np.ndarray:
        """int64 view bytes of each window, in output order (header and trailer excluded)."""

    @abstractmethod
    def window(self, k: int) -> np.ndarray:
        """Record ids of window k, in output order (`units.id_dtype`: int32 below 2**31 records)."""

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Window k's record ids as ascending runs of consecutive ids, ``(first id, count)``
        (int64), when the plan knows them without sorting the window; None otherwise."""
        return None

    @property
    def n_windows(self) -> int:
        return len(self.window_sizes)

    @property
    def window_records(self) -> np.ndarray:
        """int64 record count of each window."""
        return np.array([len(self.window(k)) for k in range(self.n_windows)], dtype=np.int64)

    def describe(self) -> dict:
        """Read-only facts for xattrs and `shufflefs stat`."""
        return {
            "strategy": self.name,
            "seed": self.spec.seed,
            "epoch": self.epoch,
            "records": self.index.n,
            "windows": self.n_windows,
            "rank": self.rank,
            "world": self.world,
            "part": self.part,
            "parts": self.parts,
        }
