"""A source's Parquet footer: its schema as a tree of leaf columns, its row groups' row counts, and
the raw bytes a view's footer copies (schema, key-value metadata, column orders).

A view keeps the source's schema elements and key-value metadata byte for byte (spliced with
``thrift.Writer.raw``), so every reader restores the same Arrow, pandas and HF types; only what
describes where bytes lie (row groups, column chunks) is written anew (`write_footer`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...errors import FormatError
from .thrift import BINARY, I32, LIST, MAX_DEPTH, STRUCT, Struct, ThriftError, Writer, read_struct

MAGIC = b"PAR1"
ENCRYPTED_MAGIC = b"PARE"

# physical types (parquet.thrift Type)
BOOLEAN, INT32, INT64, INT96, FLOAT, DOUBLE, BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY = range(8)
PHYSICAL_NAMES = ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")
FIXED_WIDTH = {INT32: 4, INT64: 8, INT96: 12, FLOAT: 4, DOUBLE: 8}
"""Bytes of one PLAIN value of the fixed-width physical types (FIXED_LEN_BYTE_ARRAY: its length)."""
REQUIRED, OPTIONAL, REPEATED = range(3)
# converted types and logical type union members that matter here
CONVERTED_MAP, CONVERTED_MAP_KEY_VALUE, CONVERTED_LIST = 1, 2, 3
CONVERTED_TIME_MILLIS, CONVERTED_TIME_MICROS, CONVERTED_TS_MILLIS, CONVERTED_TS_MICROS = 7, 8, 9, 10
LOGICAL_MAP, LOGICAL_LIST, LOGICAL_TIME, LOGICAL_TIMESTAMP = 2, 3, 7, 8
UNIT_NS = {1: 1_000_000, 2: 1_000, 3: 1}
"""Nanoseconds per unit of a logical TIME/TIMESTAMP unit (union member 1 MILLIS, 2 MICROS, 3 NANOS)."""


@dataclass(frozen=True)
class Node:
    """One schema element: a group (``children``) or a leaf column (``physical`` set)."""

    name: str
    repetition: int
    children: tuple["Node", ...]
    physical: int | None
    type_length: int
    converted: int | None
    logical: Struct | None
    scale: int
    precision: int

    @property
    def is_group(self) -> bool:
        return self.physical is None

    @property
    def is_list(self) -> bool:
        lt = self.logical.fields if self.logical is not None else {}
        return LOGICAL_LIST in lt or self.converted == CONVERTED_LIST

    @property
    def is_list_or_map(self) -> bool:
        """Annotated LIST or MAP: its repeated child carries the offsets of one Arrow list/map."""
        lt = self.logical.fields if self.logical is not None else {}
        return (LOGICAL_LIST in lt or LOGICAL_MAP in lt
                or self.converted in (CONVERTED_LIST, CONVERTED_MAP, CONVERTED_MAP_KEY_VALUE))


@dataclass(frozen=True)
class Leaf:
    """A leaf column: the chain of schema nodes from a top-level field down to it."""

    index: int
    top: int
    """The position of its top-level field (the Arrow table's column)."""
    chain: tuple[Node, ...]
    max_def: int
    max_rep: int

    @property
    def node(self) -> Node:
        return self.chain[-1]

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.chain)

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def physical(self) -> int:
        return self.node.physical  # type: ignore[return-value]

    @property
    def width(self) -> int:
        """Bytes of one PLAIN value; 0 for BYTE_ARRAY (a length prefix and its bytes) and BOOLEAN
        (bits)."""
        if self.physical == FIXED_LEN_BYTE_ARRAY:
            return self.node.type_length
        return FIXED_WIDTH.get(self.physical, 0)

    def time_unit_ns(self) -> int | None:
        """Nanoseconds per stored unit of a TIME or TIMESTAMP column, None for other columns."""
        n = self.node
        if n.logical is not None:
            for member in (LOGICAL_TIME, LOGICAL_TIMESTAMP):
                if member in n.logical:
                    spec = n.logical.fields[member]
                    unit = spec.get(2) if isinstance(spec, Struct) else None
                    if isinstance(unit, Struct) and unit.fields:
                        return UNIT_NS.get(min(unit.fields), None)
        return {CONVERTED_TIME_MILLIS: 1_000_000, CONVERTED_TIME_MICROS: 1_000,
                CONVERTED_TS_MILLIS: 1_000_000, CONVERTED_TS_MICROS: 1_000}.get(n.converted)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SourceFooter:
    """What a view needs of its source's footer."""

    version: int
    num_rows: int
    group_rows: tuple[int, ...]
    group_offsets: tuple[int, ...]
    """The file offset of each row group's first column chunk (for error messages)."""
    top: tuple[Node, ...]
    leaves: tuple[Leaf, ...]
    schema_raw: bytes
    kv_raw: bytes | None
    orders_raw: bytes | None
    digest: str
    """sha256 of the footer: an index built from one file is never used with another."""
    group_spans: tuple[tuple[int, int], ...] = ()
    """The bytes ``[start, end)`` of the file holding each row group's column chunks (what a
    reader of the row group reads; ``(0, 0)`` where the footer does not say), so a row group is
    fetched from object storage by ranged GETs of its bytes alone."""

    @property
    def schema_key(self) -> bytes:
        """The schema and key-value metadata: sources of a pool must agree on these."""
        return self.schema_raw + b"\0" + (self.kv_raw or b"")


def _int(s: Struct, fid: int, path: str, what: str, default: int | None = 0, lo: int = 0,
         hi: int = 1 << 62) -> int | None:
    """Field ``fid`` of ``s`` as an int in ``[lo, hi]`` (``default`` when absent); a value of
    another type or range is a damaged footer."""
    v = s.get(fid)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise FormatError(path, None, f"the footer's {what} is {v!r}")
    return v


def _node_tree(elems: list, path: str) -> tuple[tuple[Node, ...], int]:
    """The schema's top-level nodes from the flattened depth-first element list."""
    pos = 0

    def build(depth: int) -> Node:
        nonlocal pos
        if pos >= len(elems) or depth > MAX_DEPTH:
            raise FormatError(path, None, "the footer's schema is malformed (children past its end)")
        e = elems[pos]
        pos += 1
        if not isinstance(e, Struct) or not isinstance(e.get(4), bytes):
            raise FormatError(path, None, "the footer's schema has an element without a name")
        name = e.get(4).decode("utf-8", "replace")
        nkids = _int(e, 5, path, f"child count of {name!r}", 0, -1, len(elems))
        kids = tuple(build(depth + 1) for _ in range(nkids)) if nkids > 0 else ()  # type: ignore[operator]
        physical = _int(e, 1, path, f"type of {name!r}", None, 0, 7) if not kids else None
        if not kids and physical is None:
            raise FormatError(path, None, f"schema leaf {name!r} has no physical type")
        length = _int(e, 2, path, f"type length of {name!r}", 0, 0, 1 << 30)
        if physical == FIXED_LEN_BYTE_ARRAY and not length:
            raise FormatError(path, None, f"schema leaf {name!r} is a FIXED_LEN_BYTE_ARRAY of no length")
        logical = e.get(10) if isinstance(e.get(10), Struct) else None
        return Node(name, _int(e, 3, path, f"repetition of {name!r}", REQUIRED, 0, 2), kids,  # type: ignore[arg-type]
                    physical, length, _int(e, 6, path, f"converted type of {name!r}", None, -(1 << 31)),  # type: ignore[arg-type]
                    logical, _int(e, 7, path, "scale", 0, -(1 << 31)), _int(e, 8, path, "precision", 0))  # type: ignore[arg-type]

    root = build(0)
    if pos != len(elems):
        raise FormatError(path, None, f"the footer's schema has {len(elems) - pos} elements outside its tree")
    return root.children, len(elems)


def _leaves(top: tuple[Node, ...]) -> tuple[Leaf, ...]:
    out: list[Leaf] = []

    def walk(node: Node, top: int, chain: tuple[Node, ...], d: int, r: int) -> None:
        d += node.repetition != REQUIRED
        r += node.repetition == REPEATED
        chain = chain + (node,)
        if not node.is_group:
            out.append(Leaf(len(out), top, chain, d, r))
        for kid in node.children:
            walk(kid, top, chain, d, r)

    for i, node in enumerate(top):
        walk(node, i, (), 0, 0)
    return tuple(out)


def parse_footer(tail: bytes, file_size: int, path: str) -> SourceFooter:
    """The footer at the end of a Parquet file of ``file_size`` bytes; ``tail`` holds at least its
    last ``footer_length(...) + 8`` bytes.  `FormatError` for anything that is not a plain
    (unencrypted) Parquet footer."""
    if len(tail) < 8 or file_size < 12:
        raise FormatError(path, 0, "too short for a Parquet file")
    if tail[-4:] == ENCRYPTED_MAGIC:
        raise FormatError(path, file_size - 4, "encrypted Parquet footers are not supported")
    if tail[-4:] != MAGIC:
        raise FormatError(path, file_size - 4, "no Parquet magic (PAR1) at the end")
    n = int.from_bytes(tail[-8:-4], "little")
    if n + 12 > file_size or n + 8 > len(tail):
        raise FormatError(path, file_size - 8, f"footer length {n} does not fit the file")
    buf = tail[len(tail) - 8 - n : len(tail) - 8]
    start = file_size - 8 - n
    try:
        meta, end = read_struct(buf)
    except ThriftError as e:
        raise FormatError(path, start, f"the footer cannot be read: {e}") from None
    if end != len(buf):
        raise FormatError(path, start + end, "bytes after the footer's end")
    if 8 in meta or 9 in meta:
        raise FormatError(path, start, "encrypted Parquet columns are not supported")
    schema, groups = meta.get(2), meta.get(4) or []
    if not isinstance(schema, list) or not schema:
        raise FormatError(path, start, "the footer has no schema")
    top, _ = _node_tree(schema, path)
    rows, offsets, spans = [], [], []
    for g in groups:
        if not isinstance(g, Struct) or 3 not in g:
            raise FormatError(path, start, "a row group of the footer has no row count")
        rows.append(_int(g, 3, path, "row count of a row group"))
        cols = g.get(1)
        md = cols[0].get(3) if isinstance(cols, list) and cols and isinstance(cols[0], Struct) else None
        offset = (_int(md, 11, path, "dictionary page offset") or _int(md, 9, path, "data page offset")
                  if isinstance(md, Struct) else 0)
        offsets.append(offset)
        spans.append(_group_span(cols, file_size, path))
    num_rows = _int(meta, 3, path, "row count", None)
    if num_rows != sum(rows):  # type: ignore[arg-type]
        raise FormatError(path, start, f"the footer says {num_rows} rows, its row groups {sum(rows)}")

    def span(fid: int, what: str, fields: tuple[int, ...] = ()) -> bytes | None:
        """A field views copy as the source's bytes: a list of structs whose first of ``fields``
        is binary, and the others binary where present; else a `FormatError` (a damaged footer
        can shift its fields, and a view must not carry what readers cannot parse)."""
        if fid not in meta.raw:
            return None
        got = meta.get(fid)
        if not isinstance(got, list) or not all(
                isinstance(x, Struct) and all(isinstance(x.get(f), bytes) for f in fields if f in x or f == fields[0])
                for x in got):
            raise FormatError(path, start + meta.raw[fid][0], f"the footer's {what} is not a list of its structs")
        a, b = meta.raw[fid]
        return bytes(buf[a:b])

    version = _int(meta, 1, path, "version", 1, -(1 << 31), 1 << 31)
    return SourceFooter(version, num_rows, tuple(rows), tuple(offsets), top, _leaves(top),  # type: ignore[arg-type]
                        span(2, "schema") or b"", span(5, "key-value metadata", (1, 2)), span(7, "column orders"),
                        hashlib.sha256(buf).hexdigest(), tuple(spans))


PAD = 100
"""Bytes past a column chunk's stated end a reader may read (pyarrow pads chunks of files from
writers with PARQUET-816 by up to this much), taken into a row group's span."""


def _group_span(cols: Any, file_size: int, path: str) -> tuple[int, int]:
    """The bytes of a row group's column chunks, as readers compute each chunk's place (from its
    dictionary page if it comes first, for its total compressed size), plus `PAD`, within the
    file; ``(0, 0)`` if a chunk lacks its metadata."""
    lo, hi = file_size, 0
    for c in cols if isinstance(cols, list) else ():
        md = c.get(3) if isinstance(c, Struct) else None
        if not isinstance(md, Struct) or 9 not in md or 7 not in md:
            return (0, 0)
        first = _int(md, 9, path, "data page offset")
        dictionary = _int(md, 11, path, "dictionary page offset")
        if dictionary and dictionary < first:  # type: ignore[operator]
            first = dictionary
        lo = min(lo, first)  # type: ignore[type-var]
        hi = max(hi, first + _int(md, 7, path, "total compressed size"))  # type: ignore[operator]
    if hi <= lo:
        return (0, 0)
    return (int(lo), int(min(hi + PAD, file_size)))


def read_footer(size: int, read: Callable[[int, int], bytes], path: str) -> SourceFooter:
    """The footer of a file of ``size`` bytes, read with ``read(start, end)`` (one or two reads)."""
    want = min(size, 64 << 10)
    tail = read(size - want, size)
    if len(tail) >= 8 and tail[-4:] == MAGIC:
        n = int.from_bytes(tail[-8:-4], "little")
        if n + 8 > len(tail) and n + 12 <= size:
            tail = read(size - n - 8, size)
    return parse_footer(tail, size, path)


def footer_of_file(path: str) -> SourceFooter:
    """`read_footer` of a local file."""
    import os

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def read(a: int, b: int) -> bytes:
            f.seek(a)
            return f.read(b - a)

        return read_footer(size, read, path)


@dataclass(frozen=True)
class ChunkMeta:
    """One column chunk of a view: its level entries, its bytes and where its first page is."""

    num_values: int
    size: int
    offset: int


ENC_PLAIN, ENC_RLE = 0, 3
CREATED_BY = b"shufflefs version 0.1.0"


def write_footer(src: SourceFooter, groups: Sequence[tuple[int, Sequence[ChunkMeta]]]) -> bytes:
    """The FileMetaData of a view: ``groups`` holds each row group's row count and its column
    chunks (one per leaf, in leaf order).  Every chunk is PLAIN, UNCOMPRESSED, without dictionary
    or statistics; schema, key-value metadata and column orders are the source's bytes."""
    w = Writer()
    w.begin_struct()
    w.i32(1, src.version)
    w.raw(2, LIST, src.schema_raw)
    w.i64(3, sum(n for n, _ in groups))
    w.begin_list(4, STRUCT, len(groups))
    paths = [[p.encode() for p in leaf.path] for leaf in src.leaves]
    encodings = [[ENC_PLAIN, ENC_RLE] if leaf.max_def or leaf.max_rep else [ENC_PLAIN] for leaf in src.leaves]
    for ordinal, (nrows, chunks) in enumerate(groups):
        if len(chunks) != len(src.leaves):
            raise ValueError("a row group needs one column chunk per leaf column")
        w.begin_struct()
        w.begin_list(1, STRUCT, len(chunks))
        for leaf, chunk in zip(src.leaves, chunks):
            w.begin_struct()
            w.i64(2, 0)  # file_offset: deprecated, readers must not rely on it; writers set 0
            w.begin_struct(3)
            w.i32(1, leaf.physical)
            w.begin_list(2, I32, len(encodings[leaf.index]))
            for e in encodings[leaf.index]:
                w.elem_i32(e)
            w.begin_list(3, BINARY, len(paths[leaf.index]))
            for p in paths[leaf.index]:
                w.elem_binary(p)
            w.i32(4, 0)  # UNCOMPRESSED
            w.i64(5, chunk.num_values)
            w.i64(6, chunk.size)
            w.i64(7, chunk.size)
            w.i64(9, chunk.offset)
            w.end_struct()
            w.end_struct()
        size = sum(c.size for c in chunks)
        w.i64(2, size)
        w.i64(3, nrows)
        w.i64(5, chunks[0].offset if chunks else 0)
        w.i64(6, size)
        if ordinal < 1 << 15:  # an i16: files of more row groups leave it out
            w.i16(7, ordinal)
        w.end_struct()
    if src.kv_raw is not None:
        w.raw(5, LIST, src.kv_raw)
    w.binary(6, CREATED_BY)
    if src.orders_raw is not None:
        w.raw(7, LIST, src.orders_raw)
    w.end_struct()
    return w.getvalue()
