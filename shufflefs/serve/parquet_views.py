"""Parquet files in a mount: what the planner and the views do differently for them.

A Parquet file's index orders its rows (`formats.parquet.index`), so it is planned like any file;
its layout is `windows.parquet_view.ParquetLayout` (row groups and a footer, not the records'
bytes) and its view a `ParquetView` that encodes row groups from the file's decoded copy
(`stages.parquet_rows`), one copy per file version for the whole mount.  Shards of a pool of
Parquet files are not pooled (`pooled`): each file is shuffled alone.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..formats import Format
from ..formats.parquet.index import ParquetIndex
from ..sources.base import Source
from ..stages.parquet_rows import RowCopies
from ..strategies.base import Plan
from ..windows.layout import Layout
from ..windows.parquet_view import ParquetLayout, ParquetView
from ..windows.view import window_work

NAME = "parquet"


def is_parquet(fmt: Format | None) -> bool:
    return fmt is not None and fmt.name == NAME


def layout_class(fmt: Format | None) -> type[Layout]:
    """The layout a view of format ``fmt`` is planned with."""
    return ParquetLayout if is_parquet(fmt) else Layout


def work_of(fmt: Format | None, view: Any, plan: Plan, k: int | None = None) -> int:
    """Bytes a window load works with besides the window (`windows.view.window_work`, or a
    Parquet view's own, its copy's decoding included)."""
    if is_parquet(fmt) and isinstance(getattr(view, "view", view), ParquetView):
        return getattr(view, "view", view).work(k)
    return window_work(plan, k)


class ParquetServing:
    """The mount's Parquet copies, and its Parquet views made over them."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.copies = RowCopies(root)

    def view(self, path: str, index: ParquetIndex, plan: Plan, layout: ParquetLayout, source: Source,
             meter: Callable[..., None] | None, distrust: Callable[[Any], None] | None) -> ParquetView:
        """Blocking: the view of ``plan`` over ``source`` (the version ``index`` is of)."""
        copy = self.copies.acquire(path, index)
        try:
            return ParquetView(path, index, plan, layout, source, copy, lambda: self.copies.release(copy), meter,
                               distrust)
        except BaseException:
            self.copies.release(copy)
            raise

    def describe(self) -> dict[str, Any]:
        return self.copies.describe()

    def close(self) -> None:
        self.copies.close()
