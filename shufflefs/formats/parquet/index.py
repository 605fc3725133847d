"""The index of a Parquet file as the mount plans it: its rows are the records.

A `ParquetIndex` is a `RecordIndex` whose records are the file's rows, in source order, each as
long as its PLAIN value bytes over all columns (`RowSizes.record_lengths`): its bounds are those
lengths' prefix sums, a space of the rows' bytes, not of the file's.  So the strategies plan rows
as they plan lines (blocks of consecutive rows by bytes, buffers, rank shares, parts, resume)
without knowing Parquet, and the view's layout (`layout.plan_view`) turns a plan's rows into row
groups.  It keeps the source's footer and the per-row sizes (`sizes`), and is cached like any
index, keyed by the file's version (`cache_arrays`: the sizes and the footer's bytes).

Per row it holds 8 bytes of bounds plus the sizes' (0 to 8 bytes per leaf column that varies).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ...index.table import RecordIndex, SourceStamp
from .footer import SourceFooter, parse_footer
from .sizes import RowSizes


def row_bounds(sizes: RowSizes) -> np.ndarray:
    """The records' bounds: 0, then the prefix sums of every row's PLAIN bytes (int64)."""
    bounds = np.zeros(sizes.n_rows + 1, np.int64)
    np.cumsum(sizes.record_lengths(), out=bounds[1:])
    return bounds


class ParquetIndex(RecordIndex):
    """A `RecordIndex` of a Parquet file's rows with its footer and row sizes (module docstring).
    ``tail``: the file's last bytes, footer through the closing magic (what the cache keeps)."""

    cache_kind: ClassVar[str] = "parquet"
    footer: SourceFooter
    sizes: RowSizes
    tail: bytes

    def __init__(self, footer: SourceFooter, sizes: RowSizes, tail: bytes, stamp: SourceStamp | None = None,
                 bounds: np.ndarray | None = None) -> None:
        bounds = row_bounds(sizes) if bounds is None else bounds
        super().__init__(int(bounds[-1]), bounds, False, stamp)
        object.__setattr__(self, "footer", footer)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "tail", tail)

    def stamped(self, stamp: SourceStamp) -> "ParquetIndex":
        return ParquetIndex(self.footer, self.sizes, self.tail, stamp, self.bounds)

    @property
    def nbytes(self) -> int:
        """Bytes this index holds in memory."""
        return self.bounds.nbytes + self.sizes.nbytes + len(self.tail)

    def cache_arrays(self) -> dict[str, np.ndarray]:
        """What the cache keeps besides the bounds (`table.IndexCache`)."""
        arrays = {f"rows_{k}": v for k, v in self.sizes.to_arrays().items()}
        arrays["tail"] = np.frombuffer(self.tail, np.uint8)
        return arrays

    @classmethod
    def from_cache(cls, index: RecordIndex, arrays: dict[str, np.ndarray]) -> "ParquetIndex":
        """The index of a cache entry (``index``: its bounds and stamp) with the arrays
        `cache_arrays` saved; ValueError if they cannot be this index's."""
        from ...errors import FormatError

        if index.stamp is None:
            raise ValueError("a Parquet index entry without its file's version")
        tail = bytes(np.asarray(arrays["tail"], np.uint8))
        try:
            footer = parse_footer(tail, index.stamp.size, "(index cache entry)")
        except FormatError as e:
            raise ValueError(str(e)) from None
        sizes = RowSizes.from_arrays({k[5:]: v for k, v in arrays.items() if k.startswith("rows_")})
        if sizes.digest != footer.digest or sizes.n_rows != footer.num_rows:
            raise ValueError("row sizes of another footer")
        if tuple(np.diff(sizes.group_starts).tolist()) != footer.group_rows:
            raise ValueError("row groups that are not the footer's")
        if not np.array_equal(index.bounds, row_bounds(sizes)):
            raise ValueError("bounds that are not the rows' sizes")
        return cls(footer, sizes, tail, index.stamp, index.bounds)
