"""Definition and repetition levels of one leaf column, computed from Arrow arrays with numpy.

Parquet flattens a nested column into *level entries*: one per leaf value, plus one for every
null or empty list above it.  Each entry has a definition level (how many optional or repeated
nodes of its path are present) and a repetition level (at which repeated node it starts a new
element; 0 starts a row).  pyarrow decodes a source row group into nested Arrow arrays; this
module walks the leaf's path through them top-down, all entries of a level at once, expanding
the entries of each list by its offsets (`np.repeat`), so the cost is a few numpy passes per
nesting level whatever the row count, and never a Python loop over rows.

Which Arrow array holds which schema node follows pyarrow's reading of the schema (Arrow C++
``schema.cc``): a LIST- or MAP-annotated group and its repeated child are one Arrow list (validity
from the group, offsets from the repeated child); a repeated group under a LIST with one child
is the list's element unless it is named ``array`` or ``*_tuple``; other groups are structs whose
fields are the group's children in order.  Imports pyarrow only inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import FormatError
from .footer import OPTIONAL, REPEATED, Leaf, Node
from .values import int_dtype, primitive, sliced


@dataclass
class Walk:
    """A leaf's level entries for the rows of one Arrow chunk.

    ``slots``: int64, rows + 1: the first entry of each row (None: one entry per row);
    ``defs``/``reps``: uint8 per entry (None when the column has no such levels); ``present``:
    bool per entry, the entries holding a value; ``leaf``: the Arrow array holding the values
    (dictionaries resolved, extension types unwrapped) and ``index``: int64, the position in
    ``leaf`` of each present entry's value, in entry order."""

    rows: int
    slots: np.ndarray | None
    defs: np.ndarray | None
    reps: np.ndarray | None
    present: np.ndarray
    leaf: Any
    index: np.ndarray


def _pa() -> Any:
    import pyarrow

    return pyarrow


def unwrap(arr: Any) -> Any:
    """The storage of extension arrays (UUIDs, JSON, tensors, ...): what Parquet stores."""
    pa = _pa()
    while isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    return arr


def validity(arr: Any) -> np.ndarray | None:
    """Bool per element (True: valid), or None when nothing is null; read from the validity
    bitmap (``to_numpy`` of ``is_valid()`` costs 100 times more)."""
    if arr.null_count == 0:
        return None
    bitmap = arr.buffers()[0]
    if bitmap is None:  # a NullArray: all null, no bitmap
        return np.zeros(len(arr), bool)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8, count=(arr.offset + len(arr) + 7) // 8), bitorder="little")
    return bits[arr.offset : arr.offset + len(arr)].view(bool)


def list_spans(arr: Any, path: str, where: str) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(starts, lengths, values)`` of a list-like Arrow array: the span of each element's items
    in ``values`` (int64 arrays, one per element)."""
    pa = _pa()
    if isinstance(arr, pa.FixedSizeListArray):
        size = arr.type.list_size
        starts = (np.arange(len(arr), dtype=np.int64) + arr.offset) * size
        return starts, np.full(len(arr), size, np.int64), arr.values
    bufs = arr.buffers()
    if isinstance(arr, (pa.ListViewArray, pa.LargeListViewArray)):
        odt = "<i8" if isinstance(arr, pa.LargeListViewArray) else "<i4"
        starts = sliced(bufs[1], odt, arr.offset, len(arr)).astype(np.int64)
        return starts, sliced(bufs[2], odt, arr.offset, len(arr)).astype(np.int64), arr.values
    if isinstance(arr, (pa.ListArray, pa.LargeListArray)):  # MapArray is a ListArray
        odt = "<i8" if isinstance(arr, pa.LargeListArray) else "<i4"
        off = sliced(bufs[1], odt, arr.offset, len(arr) + 1).astype(np.int64)
        return off[:-1], np.diff(off), arr.values
    raise FormatError(path, None, f"{where}: a repeated field read as {arr.type}, not as a list")


def _is_struct_list_name(node: Node) -> bool:
    return node.name == "array" or node.name.endswith("_tuple")


def _child(arr: Any, node: Node, kid: Node, parent: Node | None, path: str, where: str) -> Any:
    """The Arrow array of schema node ``kid``, a child of ``node`` whose array is ``arr`` (for a
    repeated ``node``, ``arr`` is already its list's items)."""
    pa = _pa()
    if node.is_list_or_map and kid.repetition == REPEATED:
        return arr  # the list itself: kid's offsets
    if (node.repetition == REPEATED and parent is not None and parent.is_list
            and len(node.children) == 1 and not _is_struct_list_name(node)):
        return arr  # a LIST's repeated group: its one child is the element
    if not isinstance(arr, pa.StructArray) or arr.type.num_fields != len(node.children):
        raise FormatError(path, None, f"{where}: group {node.name!r} read as {arr.type}, "
                          f"not as a struct of {len(node.children)} fields")
    return arr.field(node.children.index(kid))


def walk(leaf: Leaf, column: Any, path: str) -> Walk:
    """The level entries of ``leaf`` over ``column``, one chunk of its top-level Arrow column."""
    pa = _pa()
    where = f"column {leaf.dotted}"
    n = len(column)
    idx = np.arange(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    defs = np.zeros(n, np.uint8) if leaf.max_def else None
    reps = np.zeros(n, np.uint8) if leaf.max_rep else None
    slots: np.ndarray | None = None
    if leaf.max_def > 255 or leaf.max_rep > 255:
        raise FormatError(path, None, f"{where}: nested deeper than 255 levels")
    arr = column
    d = r = 0
    chain = leaf.chain
    for k, node in enumerate(chain):
        if k:
            arr = _child(arr, chain[k - 1], node, chain[k - 2] if k > 1 else None, path, where)
        arr = unwrap(arr)
        if isinstance(arr, pa.DictionaryArray) and arr.dictionary.null_count:
            arr = arr.dictionary_decode()  # nulls in the dictionary: a value's validity is there
        if isinstance(arr, pa.DictionaryArray) and node.is_group:
            raise FormatError(path, None, f"{where}: group {node.name!r} read as {arr.type}")
        valid = validity(arr)
        if node.repetition == OPTIONAL:
            d += 1
            if valid is not None:
                alive &= valid[np.where(alive, idx, 0)] if len(valid) else alive
            if defs is not None:
                defs[alive] = d
        elif valid is not None and not valid[idx[alive]].all():
            kind = "repeated" if node.repetition == REPEATED else "required"
            raise FormatError(path, None, f"{where}: a null where the schema's {kind} {node.name!r} allows none")
        if node.repetition != REPEATED:
            continue
        d += 1
        r += 1
        starts, lengths, values = list_spans(arr, path, where)
        at = np.where(alive, idx, 0)
        lens = np.where(alive, lengths[at] if len(lengths) else 0, 0)
        counts = np.maximum(lens, 1)
        first = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        total = int(first[-1])
        pos = np.arange(total, dtype=np.int64) - np.repeat(first[:-1], counts)
        idx = np.repeat(np.where(alive, starts[at] if len(starts) else 0, 0), counts) + pos
        alive = np.repeat(lens > 0, counts)
        if defs is not None:
            defs = np.repeat(defs, counts)
            defs[alive] = d
        if reps is not None:
            reps = np.repeat(reps, counts)
            reps[pos > 0] = r
        slots = first if slots is None else first[slots]
        arr = values
    if leaf.node.is_group:
        raise FormatError(path, None, f"{where}: a leaf without a physical type")
    arr = unwrap(arr)
    index = idx[alive]
    if isinstance(arr, pa.DictionaryArray):
        codes = primitive(arr.indices, int_dtype(pa, arr.indices.type))  # nulls are never read
        index = codes[index].astype(np.int64) if len(index) else index
        arr = unwrap(arr.dictionary)
    if pa.types.is_nested(arr.type):
        raise FormatError(path, None, f"{where}: the leaf {leaf.node.name!r} read as {arr.type}")
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= len(arr)):
        raise FormatError(path, None, f"{where}: a value index outside its array")
    return Walk(n, slots, defs, reps, alive, arr, index)
