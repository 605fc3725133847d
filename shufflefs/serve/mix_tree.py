"""The ``.mix`` directory of a mount: ``.mix/NAME/`` for every mixture of the config file,
holding its shards as views (probes carry a `pools.mixes.MixEntry` where a pool's shard carries
its `PoolEntry`).  Blocking, for worker threads, like `tree.Tree`'s probes."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import replace
from types import SimpleNamespace

from ..config import MIX_DIR
from ..pools.mixes import MixEntry, MixTable
from .nodes import ROOT, Probe, Stat
from .tree import Tree


def in_mix_tree(relpath: str) -> bool:
    return relpath == MIX_DIR or relpath.startswith(MIX_DIR + "/")


class MixTree:
    """Probes of ``.mix``, ``.mix/NAME`` and ``.mix/NAME/SHARD``.  A shard's attributes: its
    files' newest mtime and ctime (so a changed source is a new version), read-only; its size
    comes from its plan, like a pool shard's."""

    def __init__(self, table: MixTable, tree: Tree) -> None:
        self.table, self.tree = table, tree

    def _dir(self, name: str) -> Probe:
        return Probe(name, self.tree.nodes[ROOT].st, None, None, None, None, time.monotonic())

    def look(self, parent: str, name: str) -> Probe | None:
        """The probe of ``name`` in ``parent`` (``""``: the root, where only ``.mix`` is ours)."""
        if parent == "":
            return self._dir(MIX_DIR) if name == MIX_DIR else None
        if parent == MIX_DIR:
            return self._dir(name) if self.table.find(name) is not None else None
        mix = parent[len(MIX_DIR) + 1:]
        if "/" in mix:
            return None
        entry = self.table.entry(mix, name)
        if entry is None:
            return None
        return self._shards(entry, [name])[0]

    def _shards(self, entry: MixEntry, names: list[str]) -> list[Probe]:
        """Probes of shards ``names`` of ``entry``'s mixture (its files' attributes read once)."""
        mix, root = entry.pool, self.tree.nodes[ROOT].st
        first = self.tree.store.stat(mix.members[0], follow_last=True)
        mtime, ctime = max(s.mtime_ns for s in entry.stamps), max(s.ctime_ns for s in entry.stamps)
        fmt, now = self.tree.format(mix.members[0]), time.monotonic()
        st = Stat(SimpleNamespace(
            st_mode=stat.S_IFREG | (first.st_mode & 0o444), st_ino=0, st_nlink=1, st_uid=root.st_uid,
            st_gid=root.st_gid, st_size=0, st_atime_ns=mtime, st_mtime_ns=mtime, st_ctime_ns=ctime,
            st_blksize=root.st_blksize, st_blocks=0))
        return [Probe(name, st, fmt, None, None, replace(entry, shard=mix.shard_of[name]), now) for name in names]

    def list(self, relpath: str) -> list[Probe]:
        if relpath == MIX_DIR:
            return [self._dir(name) for name in sorted(self.table.specs)]
        mix = self.table.find(relpath[len(MIX_DIR) + 1:])
        if mix is None:
            return []
        return self._shards(self.table.entry(mix.spec.name, mix.names[0]), list(mix.names))

    def probe(self, relpath: str) -> Probe | None:
        return self.look(os.path.dirname(relpath), os.path.basename(relpath))
