"""How a view is served to the kernel: through the page cache, or ``direct_io`` (each read as the
application issued it, copied once into its buffer; a shared ``mmap`` of it fails with ENODEV).
Pure: decided from the node, the options and the view's choice of how it reads its source."""

from __future__ import annotations

from typing import Any

from ..config import MountConfig
from .nodes import VIEW, Node

PAGE_CACHE_FORMATS = frozenset({"npy", "fixed"})
"""Formats served through the page cache even with ``--direct-io``, because their usual readers
map them (``numpy.load(..., mmap_mode='r')``, ``numpy.memmap``) and a shared mmap of a direct_io
file fails with ENODEV (libfuse 3.14 cannot ask for FUSE_DIRECT_IO_ALLOW_MMAP).  Without
``--direct-io`` views are served through the page cache but where `AUTO_DIRECT_FORMATS` says, as
CSV and Arrow readers map files too (``pandas.read_csv`` of files from 5 MB on).  Safe because a
view inode's bytes never change: a new epoch, source version or part is a new inode (`tree.Tree`)."""
AUTO_DIRECT_FORMATS = frozenset({"lines", "tfrecord", "tar"})
"""Formats whose views are served with ``direct_io`` when their windows do not keep their source's
pages (``--source-cache`` chose ``drop`` or ``direct``: the file and its view do not fit the page
cache), as their readers read them by ``read()`` (line loops, pandas and polars JSON, datasets,
TFRecord and WebDataset readers).  A reply is then copied once, into the reader's buffer, instead
of into view pages that the reader copies again and memory pressure reclaims: measured on a
2-core VM (2 GiB of JSON lines, daemon and reader in a 512 MiB cgroup, 1 MiB reads), ``none``
1.07 -> 1.82 GB/s (a raw read 2.45), the reader's CPU 0.71 -> 0.07 s per GB; ``stratified``
0.64 -> 0.75.  CSV (pandas maps it), Parquet (mapped, read at random) and compressed views stay in
the page cache."""


def page_cache(node: Node, config: MountConfig, counts: dict[str, int] | None = None) -> bool:
    """Whether the kernel may cache the bytes of an opened node; ``counts``: views served so, by
    reason (for ``shufflefs stat``)."""
    if node.kind != VIEW:
        return True
    if node.fmt.name in PAGE_CACHE_FORMATS:
        cached, why = True, "page cache: mapped by its readers"
    elif config.direct_io or config.page_cache:
        cached, why = config.page_cache, "page cache: --page-cache" if config.page_cache else "direct_io: --direct-io"
    elif node.fmt.name not in AUTO_DIRECT_FORMATS:
        cached, why = True, "page cache"
    else:
        inner: Any = getattr(node.view, "view", None)
        cached = not (getattr(inner, "direct", False) or getattr(inner, "drop_behind", False))
        why = "page cache" if cached else "direct_io: its source does not stay cached"
    if counts is not None:
        counts[why] = counts.get(why, 0) + 1
    return cached
