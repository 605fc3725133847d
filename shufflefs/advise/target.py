"""Blocks per buffer for a shuffle-quality target (``shufflefs advise --target-mix``).

A block shuffle of a label-sorted file mixes labels only as well as its buffer: a buffer of n
one-label blocks holds the labels in multinomial(n, 1/L) proportions, whose mean total-variation
distance from the file's mix is `shufflefs.quality.expected_block_mix_tv` (de Moivre).  The
label-mix metric scores windows of 1,000 records, which add their own sampling noise: a uniform
shuffle scores ``expected_block_mix_tv(1000, 10)`` = 0.0378.  The two are combined as independent
errors, sqrt(buffer_mix^2 + uniform^2) (exact for the root mean square of independent errors, an
approximation for the mean TV), and `blocks_for_mix` finds the fewest blocks per buffer meeting a
target; the buffer is those blocks times the block size, and the daemon keeps about
`WINDOWS_KEPT` windows of it per file being read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .probe import WINDOWS_KEPT, Advice, MiB, _flag, _size
from ..quality.metrics import expected_block_mix_tv
from ..strategies.base import OBJECT_BLOCK_MAX

MIX_LABELS = 10
MIX_WINDOW = 1000
"""The label-mix metric's setting: windows of 1,000 records over 10 equally common labels."""
DEFAULT_TARGET_MIX = 0.074
"""Within 2x of what a uniform shuffle scores (``expected_block_mix_tv(1000, 10)`` = 0.0378)."""
OBJECT_BLOCK = OBJECT_BLOCK_MAX
"""Block size on object storage for buffers of many blocks: the automatic one of buffers of 256 MiB
and more (`strategies.base.object_block_size`), one request per block."""


@dataclass(frozen=True)
class MixAdvice:
    target: float
    uniform: float
    """Mean label-mix TV of a uniform shuffle's windows (sampling noise of MIX_WINDOW records)."""
    blocks: int
    """Blocks per buffer: the fewest from which on the combined expected mix is <= target."""
    expected: float
    block_size: int
    object_block: int = OBJECT_BLOCK

    @property
    def buffer(self) -> int:
        """The blocks, rounded up to whole MiB (a few more blocks only mix better)."""
        return _whole_mib(self.blocks * self.block_size)

    @property
    def object_buffer(self) -> int:
        return _whole_mib(self.blocks * self.object_block)


def _whole_mib(n: int) -> int:
    return -(-n // MiB) * MiB


def expected_window_mix(blocks: int, labels: int = MIX_LABELS, window: int = MIX_WINDOW) -> float:
    """Expected label mix of ``window``-record windows of a buffer of ``blocks`` one-label blocks:
    the buffer's own deviation (`expected_block_mix_tv`) and a window's sampling noise (the same
    formula for ``window`` draws) combined as independent errors, sqrt(buffer^2 + uniform^2)."""
    return math.hypot(expected_block_mix_tv(blocks, labels), expected_block_mix_tv(window, labels))


def blocks_for_mix(target: float, labels: int = MIX_LABELS, window: int = MIX_WINDOW) -> int:
    """The fewest blocks per buffer from which on `expected_window_mix` is at most ``target`` (the
    mean deviation falls in small steps, not strictly: the next ``labels`` counts are checked too).
    Raises ValueError for a target a uniform shuffle does not reach."""
    uniform = expected_window_mix(10**12, labels, window)
    if not target > uniform:
        raise ValueError(f"a target mix of {target} is not above a uniform shuffle's {uniform:.4f}")

    def ok(n: int) -> bool:
        return all(expected_window_mix(m, labels, window) <= target for m in range(n, n + labels + 1))

    hi = 1
    while not ok(hi):
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def for_mix(target: float, block_size: int, labels: int = MIX_LABELS, window: int = MIX_WINDOW) -> MixAdvice:
    """Blocks per buffer and buffer for a label-mix ``target`` with blocks of ``block_size``."""
    n = blocks_for_mix(target, labels, window)
    return MixAdvice(target, expected_block_mix_tv(window, labels), n, expected_window_mix(n, labels, window),
                     block_size)


def format_mix(mix: MixAdvice, advice: Advice | None = None) -> str:
    kept = WINDOWS_KEPT
    lines = [
        (f"label mix:  target {mix.target:.3f} for windows of {MIX_WINDOW:,} records over {MIX_LABELS} labels "
         f"(a uniform shuffle {mix.uniform:.3f}); a buffer of n one-label blocks scores "
         "sqrt(block_mix(n)^2 + uniform^2)"),
        f"            {mix.blocks} blocks per buffer -> {mix.expected:.4f}",
        (f"local:      --block-size {_flag(mix.block_size)} --buffer {_flag(mix.buffer)} "
         f"({mix.buffer // mix.block_size} x {_size(mix.block_size)}); memory ~{kept} x {_size(mix.buffer)} = "
         f"{_size(kept * mix.buffer)} per file read at once"),
        (f"objects:    --block-size {_flag(mix.object_block)} (one request per block) --buffer "
         f"{_flag(mix.object_buffer)}; memory ~{_size(kept * mix.object_buffer)} per file read at once"),
    ]
    if advice is not None and advice.block_size == mix.block_size and advice.blocks_per_window < mix.blocks:
        lines.append(f"note: the budget's buffer holds {advice.blocks_per_window} blocks: expected mix "
                     f"{expected_window_mix(max(advice.blocks_per_window, 1)):.3f}; --budget "
                     f"{_flag(kept * mix.buffer)} meets the target")
    return "\n".join(lines)


__all__ = ["DEFAULT_TARGET_MIX", "MIX_LABELS", "MIX_WINDOW", "OBJECT_BLOCK", "MixAdvice", "blocks_for_mix",
           "expected_window_mix", "for_mix", "format_mix"]
