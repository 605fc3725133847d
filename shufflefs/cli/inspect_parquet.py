"""``shufflefs inspect`` of Parquet files: labels read from a column, not from the file's bytes.

A Parquet file's records are its rows, so its label is a column: ``--label-field COLUMN`` (or
``--label-column COLUMN``) reads that column alone from the file, or from every member of a pool
or mixture in pool order, and the label mix of each strategy is measured with it.  Its views are
re-encoded rows, not source bytes, so ``--verify`` (a byte comparison) does not apply.
"""

from __future__ import annotations

import os
from typing import Any

from .common import CliError

PARQUET = "parquet"


def is_parquet(fmt: Any) -> bool:
    return getattr(fmt, "name", None) == PARQUET


def check_parquet(fmt: Any, label_source: Any, verify: bool, path: str) -> None:
    """Refuse what does not apply to a Parquet file, saying what does."""
    from ..quality.labels import BYTE

    if verify:
        raise CliError(f"{path}: --verify compares a view's bytes with the source's records; a Parquet view "
                       "re-encodes its rows (read it with pyarrow and compare the rows)")
    if label_source is not None and label_source.kind == BYTE:
        raise CliError(f"{path}: --label-byte reads fixed-size records; a Parquet file's label is a column: "
                       "--label-field COLUMN")


def parquet_labels(got: Any, label_source: Any) -> Any:
    """The label of every row the plans order: column ``label_source.key`` of the file, or of a
    pool's members concatenated in pool order (the ids its plans use)."""
    from ..quality.labels import parquet_labels as read_labels

    paths = got.members if got.members is not None else [got.source]
    return read_labels(paths, str(label_source.key), int(got.index.n))


def label_hint(got: Any) -> str:
    """What a Parquet file's label mix needs, with the columns to choose from."""
    from ..quality.labels import parquet_columns

    path = got.members[0] if got.members else got.source
    try:
        names = parquet_columns(path)
    except (OSError, ValueError) as e:
        names = [f"(unreadable: {e})"]
    shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    return (f"no label mix: a Parquet file's label is one of its columns; name it with --label-field COLUMN "
            f"(columns of {os.path.basename(str(path))}: {shown})")
