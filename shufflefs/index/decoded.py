"""The index of a compressed file: its records' bounds in the *decoded* bytes, and the restart
points from which those bytes can be decoded at random (`Restarts`).

A `DecodedIndex` is a `table.RecordIndex` whose offsets, size and header are the decoded
file's, stamped with the compressed file's version: plans, layouts, windows and stages work on
it as on a plain text file, and only its source reads differently (`sources.decoded`).  It is
cached like any index (keyed by the compressed file's version), its restart points saved in the
same entry (`cache_arrays`).

Its `block_floor` is the smallest block worth decoding from a restart point: reading a block
decodes from the restart point before it to the end of the block, so a block of ``k`` restart
intervals decodes about ``(k + 1) / k`` of its bytes; blocks are made at least `RESTART_BLOCKS`
intervals long.  A file whose restart points are further apart than `MAX_SPACING` (a zstd file
of one frame) has none worth using: it is decoded once into a node-local copy (`staged`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .table import RecordIndex, SourceStamp

RESTART_BLOCKS = 1
"""An automatic block spans at least this many restart intervals (the nearest power of two),
decoding about twice its bytes: 1 MiB for gzip.  More would decode less per block but leave a
buffer fewer blocks, whose labels mix worse (a 64 MiB buffer of 4 MiB blocks: 0.16 from the file's
mix, 16 blocks; of 1 MiB blocks, 64); a random 1 MiB gzip block still decodes at about 215 MB/s
of its bytes on one core, faster than a gzip line loop reads (~130 MB/s here)."""
MAX_SPACING = 4 << 20
"""Decoded bytes between restart points beyond which a file is staged rather than decoded from
them (each read of a block would decode up to twice this)."""


class Restarts:
    """Where decoding can start: decoded offset ``plain[i]`` begins at compressed offset
    ``packed[i]`` (a zstd frame, which ends at ``packed_end[i]``; for gzip, ``blob`` is
    rapidgzip's index of the points, in gztool format, and ``packed_end`` the stream's end if zero
    padding follows it), and ``plain[-1]`` is the decoded size."""

    def __init__(self, codec: str, plain: np.ndarray, packed: np.ndarray, packed_end: np.ndarray,
                 blob: np.ndarray) -> None:
        self.codec, self.plain, self.packed, self.packed_end, self.blob = codec, plain, packed, packed_end, blob

    def end(self, size: int) -> int:
        """Where the compressed stream of a file of ``size`` bytes ends: a gzip file's zero padding
        after its last member is not read (`formats.gzip_edges.stream_end`)."""
        return int(self.packed_end[-1]) if self.codec == "gzip" and len(self.packed_end) else size

    @property
    def points(self) -> int:
        """Restart points (the decoded size, ``plain[-1]``, is none)."""
        return max(0, len(self.plain) - 1)

    @property
    def spacing(self) -> float:
        """Mean decoded bytes between restart points."""
        return float(self.plain[-1]) / max(1, self.points) if len(self.plain) else 0.0

    @property
    def usable(self) -> bool:
        """Whether reads can decode from the points (else the file is staged): a file of one point
        (one zstd frame) only if it is small."""
        return self.spacing <= MAX_SPACING


class DecodedIndex(RecordIndex):
    """A `RecordIndex` of decoded bytes with its file's `Restarts` (module docstring)."""

    cache_kind: ClassVar[str] = "decoded"
    restarts: Restarts

    def __init__(self, size: int, bounds: np.ndarray, add_newline: bool, stamp: SourceStamp | None,
                 restarts: Restarts) -> None:
        super().__init__(size, bounds, add_newline, stamp)
        object.__setattr__(self, "restarts", restarts)
        floor = 0
        if restarts.usable:
            floor = 1 << max(0, int(np.round(np.log2(max(1.0, RESTART_BLOCKS * restarts.spacing)))))  # (empty: 0)
        object.__setattr__(self, "block_floor", floor)

    @property
    def codec(self) -> str:
        return self.restarts.codec

    @property
    def staged(self) -> bool:
        """No restart points worth using: its views read a decoded copy (`sources.decoded`)."""
        return not self.restarts.usable

    def stamped(self, stamp: SourceStamp) -> "DecodedIndex":
        return DecodedIndex(self.size, self.bounds, self.add_newline, stamp, self.restarts)

    def cache_arrays(self) -> dict[str, np.ndarray]:
        """What the cache keeps besides the bounds (`table.IndexCache`)."""
        r = self.restarts
        return {"codec": np.frombuffer(r.codec.encode(), np.uint8), "plain": r.plain, "packed": r.packed,
                "packed_end": r.packed_end, "blob": r.blob, "ends_checked": np.ones(1, np.uint8)}

    @classmethod
    def from_cache(cls, index: RecordIndex, arrays: dict[str, np.ndarray]) -> "DecodedIndex":
        """The index of a cache entry (``index``: its bounds) with the arrays `cache_arrays` saved;
        ValueError if they cannot be this index's."""
        plain = arrays["plain"].astype(np.int64, copy=False)
        codec = bytes(arrays["codec"]).decode()
        if len(plain) < 1 or int(plain[-1]) != index.size or (len(plain) > 1 and not (np.diff(plain) > 0).all()):
            raise ValueError("restart points that cannot be the file's")
        if codec == "gzip" and "ends_checked" not in arrays:
            raise ValueError("a gzip file's index from before its decoding was checked to reach the stream's end")
        end = arrays["packed_end"]
        if codec == "gzip" and (len(end) > 1 or (len(end) and index.stamp is not None
                                                   and not 0 < int(end[0]) <= index.stamp.size)):
            raise ValueError("a gzip stream's end that cannot be the file's")
        restarts = Restarts(codec, plain, arrays["packed"].astype(np.int64, copy=False),
                            arrays["packed_end"].astype(np.int64, copy=False), arrays["blob"].astype(np.uint8, copy=False))
        return cls(index.size, index.bounds, index.add_newline, index.stamp, restarts)
