"""Which data files form a set of shards, shuffled as one pool, and in which order.

A set is recognised by the usual shard names: files of one directory whose names differ only in
their shard number, e.g. ``train-00000-of-00064.tfrecord``, ``part-00001.jsonl``,
``shard-000123.tar``, ``data_0.npy``.  A shard name is ``STEM NUMBER [-of-TOTAL] EXT`` where

* the number is the last run of digits before the extension, and starts the name or follows one
  of ``- _ .``: so ``v2-train-0001.jsonl`` is shard 1 of ``v2-train-*.jsonl``, while
  ``model-v2.jsonl`` and ``file1.txt`` are no shard names (``v2`` reads as a version, and pooling
  two versions of a dataset by mistake is worse than missing a pool: declare a glob for those);
* the extension is every trailing ``.part`` that starts with a letter, kept whole
  (``.jsonl.gz``, ``.tar.gz``), and may be empty (``part-00000``);
* for the ``-of-TOTAL`` form the total belongs to the set (``x-0-of-2`` and ``x-0-of-3`` differ);
* zero padding does not: ``p-9.jsonl`` and ``p-10.jsonl`` are shards 9 and 10 of one set.

A set needs at least two members, all data files of one format.  Declared globs (relative to the
mount root, matched like `FormatRule` globs) override the names: each forms one set of all the
data files it matches, across directories, and claims them from the name-recognised sets.
Anything that is not a set of two or more files of one format is left alone, never split up.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..formats import FormatRule

__all__ = ["ShardSet", "find_sets", "membership", "path_order", "shard_key"]

_EXT = r"(?P<ext>(?:\.[A-Za-z][A-Za-z0-9]*)*)"
_STEM = r"(?P<stem>(?:.*[-_.])?)"
# the -of- form first: otherwise the greedy stem would read the total as the shard number
_OF_NAME = re.compile(_STEM + r"(?P<num>\d+)(?P<total>-of-\d+)" + _EXT, re.DOTALL | re.ASCII)
_NAME = re.compile(_STEM + r"(?P<num>\d+)" + _EXT, re.DOTALL | re.ASCII)
_DIGITS = re.compile(r"(\d+)", re.ASCII)


@dataclass(frozen=True)
class ShardSet:
    """Data files shuffled as one pool; output shard i of the set is its i-th share.

    ``key`` is a stable identity: for a name-recognised set the directory and the name with
    ``*`` for the number (``data/train-*-of-00064.tfrecord``, ``part-*.jsonl`` at the root); for
    a declared set the glob as written.  ``members`` are relative paths in shard order,
    ``format`` is what the caller's ``format_of`` gave every one of them, and ``declared`` says
    the set comes from a declared glob.
    """

    key: str
    members: tuple[str, ...]
    format: str
    declared: bool = False


def shard_key(name: str) -> tuple[str, int] | None:
    """``(pattern, number)`` of a file name (``"a-0002.jsonl"`` -> ``("a-*.jsonl", 2)``), or None
    when the name is no shard name.  Names with equal patterns are shards of one set."""
    m = _OF_NAME.fullmatch(name) or _NAME.fullmatch(name)
    if m is None:
        return None
    return m["stem"] + "*" + (m.groupdict().get("total") or "") + m["ext"], int(m["num"])


def path_order(relpath: str) -> tuple:
    """Sort key of a relative path: component by component, runs of digits compared by value
    (``d/p-9.jsonl`` before ``d/p-10.jsonl``), ties broken by the exact text."""
    parts = tuple(
        tuple(int(s) if i % 2 else s for i, s in enumerate(_DIGITS.split(part)))
        for part in relpath.split("/")
    )
    return parts, relpath


def find_sets(
    relpaths: Iterable[str],
    format_of: Callable[[str], str | None],
    declared: Sequence[str] = (),
) -> tuple[list[ShardSet], list[str]]:
    """The shard sets among ``relpaths``, and the data files left alone (both sorted).

    ``relpaths`` are '/'-separated paths relative to the mount root (as the mount lists them),
    from any number of directories; duplicates count once.  ``format_of`` names a file's format;
    files it gives None are no data files and appear in neither result.  Every data file appears
    exactly once: in one set or among the singles.

    ``declared`` globs are matched like `FormatRule` globs (against the relative path and the
    basename; ``*`` also spans ``/``, so ``*.jsonl`` pools every ``.jsonl`` file of the mount and
    ``**/x-*.npy`` only those below the root), tried in order: a file belongs to the first it
    matches.  A declared set whose files do not share one format, or that matches fewer than two
    data files, is left alone like a broken name set: its files become singles, none joins a
    name-recognised set.  A caller can tell a declared glob that formed no set by its key missing
    from the result.  Sets come in the `path_order` of their first members, singles in
    `path_order`.
    """
    formats: dict[str, str] = {}
    for p in set(relpaths):
        f = format_of(p)
        if f is not None:
            formats[p] = f
    rules = [FormatRule(g, "none") for g in declared]
    claimed: dict[int, list[str]] = defaultdict(list)
    named: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    singles: list[str] = []
    for p in formats:
        rule = next((i for i, r in enumerate(rules) if r.matches(p)), None)
        if rule is not None:
            claimed[rule].append(p)
            continue
        d, name = posixpath.split(p)
        k = shard_key(name)
        if k is None:
            singles.append(p)
        else:
            named[(d, k[0])].append((k[1], p))

    sets: list[ShardSet] = []

    def add(key: str, members: list[str], declared_set: bool) -> None:
        fmts = {formats[p] for p in members}
        if len(members) >= 2 and len(fmts) == 1:
            sets.append(ShardSet(key, tuple(members), fmts.pop(), declared_set))
        else:
            singles.extend(members)

    for i, members in claimed.items():
        add(declared[i], sorted(members, key=path_order), True)
    for (d, pattern), shards in named.items():
        shards.sort(key=lambda s: (s[0], posixpath.basename(s[1])))
        add(posixpath.join(d, pattern), [p for _, p in shards], False)
    sets.sort(key=lambda s: (path_order(s.members[0]), s.key))
    singles.sort(key=path_order)
    return sets, singles


def membership(sets: Iterable[ShardSet]) -> dict[str, tuple[ShardSet, int]]:
    """Each member's set and its shard index in it (output shard i shows the set's i-th share)."""
    return {p: (s, i) for s in sets for i, p in enumerate(s.members)}
