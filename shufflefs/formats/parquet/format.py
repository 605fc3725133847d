"""The ``parquet`` format: every ``*.parquet`` file is served as a Parquet file of the same schema
and rows, its rows shuffled as the mount's strategy orders records.

Scanning a file decodes its row groups one at a time (pyarrow) for the per-row sizes of the
index (`index.ParquetIndex`); a view's bytes are not the source's (`planned_size`): its layout
and size follow from the index and the plan (`layout.plan_view`), its row groups are encoded
when read.  Checking a cached index against its file reads the file's footer only.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ...errors import FormatError
from ...index.table import RecordIndex
from ..base import Format, FramingError, Progress, Read
from .decode import decode_group
from .footer import read_footer
from .index import ParquetIndex
from .sizes import build_sizes


def scan_parquet(data: np.ndarray, path: str, progress: Progress | None = None) -> ParquetIndex:
    """The index of the Parquet file whose bytes are ``data`` (mapped): its footer, and every row
    group decoded once for the rows' sizes (memory: one row group)."""
    size = len(data)
    footer = read_footer(size, lambda a, b: bytes(data[a:b]), path)
    tail_len = int.from_bytes(bytes(data[size - 8: size - 4]), "little") + 8
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for bad files
        raise FormatError(path, None, f"cannot be opened as Parquet: {e}") from None
    if not footer.leaves:
        raise FormatError(path, None, "a Parquet file without columns")

    def groups(g: int):
        dec = decode_group(pf, footer, g, path)
        if progress is not None and g + 1 < len(footer.group_offsets):
            progress(footer.group_offsets[g + 1])
        return dec

    try:
        sizes = build_sizes(footer, groups, path)
    finally:
        pf.close()
    if progress is not None:
        progress(size)
    return ParquetIndex(footer, sizes, bytes(data[size - tail_len:]))


class ParquetFormat(Format):
    """Apache Parquet files (``.parquet``), shuffled by row."""

    name = "parquet"
    extensions = {".parquet": {}}
    planned_size: ClassVar[bool] = True

    @classmethod
    def available(cls) -> str | None:
        """None if pyarrow can be imported, else what is missing (files then pass through)."""
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            return "pyarrow (the parquet extra)"
        return None

    def scan(self, data: np.ndarray, path: str, progress: Progress | None = None) -> RecordIndex:
        return scan_parquet(data, path, progress)

    def check_index(self, index: RecordIndex, read: Read, path: str) -> None:
        """The index must be of this file's footer (its digest); the rows' sizes are checked
        against the decoded rows before any byte of them is served."""
        if not isinstance(index, ParquetIndex):
            raise FramingError(path, None, "the index of a Parquet file lacks its row sizes")
        size = index.stamp.size if index.stamp is not None else None
        if size is None:
            return
        try:
            digest = read_footer(size, read, path).digest
        except FormatError as e:
            raise FramingError(path, e.offset, f"the index is of another footer than the file's ({e.message})") from None
        if digest != index.footer.digest:
            raise FramingError(path, None, "the index is of another footer than the file's")


FORMATS = (ParquetFormat,)
"""The formats this package adds to the registry (`shufflefs.formats.MODULES`)."""
