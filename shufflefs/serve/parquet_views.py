"""Parquet files in a mount: what the planner and the views do differently for them.

A Parquet file's index orders its rows (`formats.parquet.index`), so it is planned like any file;
its layout is `stages.parquet_view.ParquetLayout` (row groups and a footer, not the records'
bytes) and its view a `ParquetView` that encodes row groups from the file's decoded copy
(`stages.parquet_rows`), one copy per file version for the whole mount (a pool's or a
mixture's: one for its files).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from ..formats import Format
from ..formats.parquet.index import ParquetIndex
from ..index.joined_index import joined
from ..index.joined_index import SegmentIndex
from ..pools.parquet_pool import PoolRowsPlan, joined_parquet
from ..sources.base import Source
from ..stages.parquet_rows import RowCopies
from ..strategies.base import Plan
from ..windows.layout import Layout
from ..stages.parquet_view import ParquetLayout, ParquetView
from ..windows.view import window_work

NAME = "parquet"


def is_parquet(fmt: Format | None) -> bool:
    return fmt is not None and fmt.name == NAME


def layout_class(fmt: Format | None) -> type[Layout]:
    """The layout a view of format ``fmt`` is planned with."""
    return ParquetLayout if is_parquet(fmt) else Layout


def layout_of(fmt: Format | None, index: Any, plan: Plan, header_size: int | None = None,
              trailer_size: int | None = None) -> Layout:
    """The layout of a view of ``plan`` over ``index``; an epoch of a mixture of Parquet files
    (segments of its files' pool) is laid out over the pool's rows (`PoolRowsPlan`)."""
    if is_parquet(fmt) and isinstance(index, SegmentIndex):
        return ParquetLayout(index.base, PoolRowsPlan(plan, index), header_size, trailer_size)  # type: ignore[arg-type]
    return layout_class(fmt)(index, plan, header_size, trailer_size)


def joiner(fmt: Format | None) -> Callable[[list], Any]:
    """How a pool of files of format ``fmt`` is joined into one index."""
    return joined_parquet if is_parquet(fmt) else joined


def work_of(fmt: Format | None, view: Any, plan: Plan, k: int | None = None) -> int:
    """Bytes a window load works with besides the window (`windows.view.window_work`, or a
    Parquet view's own, its copy's decoding included)."""
    if is_parquet(fmt) and isinstance(getattr(view, "view", view), ParquetView):
        return getattr(view, "view", view).work(k)
    if getattr(getattr(view, "view", view), "direct", False):  # its O_DIRECT buffer (`sources.direct`)
        sizes = np.asarray(plan.window_sizes)
        return window_work(plan, k) + (int(sizes[k] if k is not None else sizes.max()) if len(sizes) else 0)
    return window_work(plan, k)


def copy_of(store: Any, node: Any) -> str:
    """Which decoded copy a Parquet view reads: its file's, or its pool's."""
    return store.path(node.relpath) if node.pool is None else f"pool {node.pool.pool.key}"


def span_of(fmt: Format | None, layout: Any) -> int:
    """Bytes a view's windows may take together, if more than three of its largest: a Parquet
    view's windows are pieces of its row groups, and it may hold three row groups."""
    return 3 * layout.group_bytes if is_parquet(fmt) and isinstance(layout, ParquetLayout) else 0


def ahead_of(fmt: Format | None, layout: Any, k: int, n: int) -> int:
    """Windows a sequential reader of window k has loaded ahead: ``n``, or a Parquet view's whole
    next row group."""
    return layout.ahead(k, n) if is_parquet(fmt) and isinstance(layout, ParquetLayout) else n


class ParquetServing:
    """The mount's Parquet copies, and its Parquet views made over them."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.copies = RowCopies(root)

    def view(self, path: str, index: ParquetIndex, plan: Plan, layout: ParquetLayout, source: Source,
             meter: Callable[..., None] | None, distrust: Callable[[Any], None] | None,
             copy_of: str | None = None) -> ParquetView:
        """Blocking: the view of ``plan`` over ``source`` (the version ``index`` is of), read from
        the copy of ``copy_of`` (default: ``path``; a pool's shards: the pool's; a mixture's
        shards: its files' pool's, the rows its layout gives)."""
        if isinstance(layout.plan, PoolRowsPlan):
            if distrust is not None:
                distrust = (lambda _, mine=index, tell=distrust: tell(mine))  # the epoch's index is the one found wrong
            index, plan = layout.index, layout.plan  # type: ignore[assignment]
        copy = self.copies.acquire(copy_of or path, index)
        try:
            return ParquetView(path, index, plan, layout, source, copy, lambda: self.copies.release(copy), meter,
                               distrust)
        except BaseException:
            self.copies.release(copy)
            raise

    def describe(self) -> dict[str, Any]:
        """For ``user.shufflefs.stats``: the copies (`DETAILS`: they name files), if any."""
        got = self.copies.describe()
        return {"parquet_copies": got} if got["copies"] else {}

    def describe_view(self, path: str, layout: Any) -> dict[str, Any]:
        """What ``user.shufflefs.info`` says of a Parquet view: its row groups, how it is
        encoded, and its file's decoded copy."""
        copy = self.copies.describe()["copies"].get(path)
        rows = layout.view.group_bounds if isinstance(layout, ParquetLayout) else None
        return {"row_groups": 0 if rows is None else len(rows) - 1,
                "windows": layout.n_windows if isinstance(layout, ParquetLayout) else 0,
                "rows_per_row_group": 0 if rows is None or len(rows) < 2 else int((rows[1:] - rows[:-1]).max()),
                "encoding": "PLAIN, uncompressed, no dictionaries or statistics",
                "copy_dir": self.copies.describe()["dir"], **({"copy": copy} if copy is not None else {})}

    def close(self) -> None:
        self.copies.close()
