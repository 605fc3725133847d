"""Parquet views: a Parquet source shown as a Parquet file of the same schema and rows, in a new
row order, without FUSE (a mount serves `layout` and `encode`).

A view is written by our own encoder: every column chunk PLAIN, uncompressed, without
dictionary or statistics, levels bit-packed.  So every page's size follows from per-row sizes
kept in an index (`sizes`), a view's footer and offsets are known when it is opened (`layout`,
numpy only), and its row groups are encoded on demand from the source row groups holding their
rows, decoded by pyarrow (`decode`, `encode`).  The schema and key-value metadata are copied from
the source's footer byte for byte (`footer`, `thrift`), so readers restore the same types.
Dictionary-encoded columns are written as their values, and a reader that restores the
dictionary type builds each dictionary anew in the order values first appear in the view: the
values are the source's, the dictionary's order (pandas category codes) is not.

Modules, in the order a byte travels: `thrift` (compact protocol), `footer` (the source's
footer, the view's), `levels` and `values` (Arrow arrays to levels and PLAIN values), `decode`
(a source row group in that form), `sizes` (the index), `pages` (page sizes and bytes),
`layout` (a view's offsets and footer), `encode` (a view's row group).

Imports `errors` and numpy; pyarrow (the ``parquet`` extra) is imported only inside functions
that decode, so this package imports without it.
"""

from __future__ import annotations

from .decode import DecodedGroup, SourceGroups, decode_group
from .encode import encode_group, view_bytes, write_view
from .footer import SourceFooter, footer_of_file, read_footer
from .format import FORMATS, ParquetFormat
from .index import ParquetIndex
from .layout import ViewLayout, plan_view
from .sizes import RowSizes, build_sizes, sizes_of_file

__all__ = [
    "FORMATS",
    "DecodedGroup",
    "ParquetFormat",
    "ParquetIndex",
    "RowSizes",
    "SourceFooter",
    "SourceGroups",
    "ViewLayout",
    "build_sizes",
    "decode_group",
    "encode_group",
    "footer_of_file",
    "plan_view",
    "read_footer",
    "sizes_of_file",
    "view_bytes",
    "write_view",
]
