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
from ..pools.access import Access
from ..pools.mixes import MixEntry, MixError, MixTable
from .nodes import ROOT, Probe, Stat, shard_stat
from .tree import Tree


def in_mix_tree(relpath: str) -> bool:
    return relpath == MIX_DIR or relpath.startswith(MIX_DIR + "/")


class MixTree:
    """Probes of ``.mix``, ``.mix/NAME`` and ``.mix/NAME/SHARD``.  A shard's attributes: its
    files' newest mtime and ctime (so a changed source is a new version), read-only, and the mode
    and owners of its `MixEntry` (readable only by whoever may read all its files); its size
    comes from its plan, like a pool shard's.  ``.mix/NAME`` is listed and entered by whoever may
    read its shards: nothing in it (how many shards, their extension) is for anyone else."""

    def __init__(self, table: MixTable, tree: Tree) -> None:
        self.table, self.tree = table, tree

    def _dir(self, name: str, access: Access | None = None) -> Probe:
        st = self.tree.nodes[ROOT].st
        if access is not None:
            st = shard_stat(st, Access(access.listing(), access.uid, access.gid))
        return Probe(name, st, None, None, None, None, time.monotonic())

    def _mix_dir(self, name: str) -> Probe | None:
        """``.mix/NAME``, its mode from its files' (`MixError` or OSError if they cannot be read)."""
        mix = self.table.find(name)
        return None if mix is None else self._dir(name, self.table.entry(name, mix.names[0]).access)

    def look(self, parent: str, name: str) -> Probe | None:
        """The probe of ``name`` in ``parent`` (``""``: the root, where only ``.mix`` is ours)."""
        if parent == "":
            return self._dir(MIX_DIR) if name == MIX_DIR else None
        if parent == MIX_DIR:
            return self._mix_dir(name)
        mix = parent[len(MIX_DIR) + 1:]
        if "/" in mix:
            return None
        entry = self.table.entry(mix, name)
        if entry is None:
            return None
        return self._shards(entry, [name])[0]

    def _shards(self, entry: MixEntry, names: list[str]) -> list[Probe]:
        """Probes of shards ``names`` of ``entry``'s mixture (from its files' stamps and modes)."""
        mix, root, access = entry.pool, self.tree.nodes[ROOT].st, entry.access
        assert access is not None  # the table's entries have it
        mtime, ctime = max(s.mtime_ns for s in entry.stamps), max(s.ctime_ns for s in entry.stamps)
        fmt, now = self.tree.format(mix.members[0]), time.monotonic()
        st = Stat(SimpleNamespace(
            st_mode=stat.S_IFREG | access.mode, st_ino=0, st_nlink=1, st_uid=access.uid,
            st_gid=access.gid, st_size=0, st_atime_ns=mtime, st_mtime_ns=mtime, st_ctime_ns=ctime,
            st_blksize=root.st_blksize, st_blocks=0))
        return [Probe(name, st, fmt, None, None, replace(entry, shard=mix.shard_of[name]), now) for name in names]

    def list(self, relpath: str) -> list[Probe]:
        if relpath == MIX_DIR:
            return [self._listed_dir(name) for name in sorted(self.table.specs)]
        mix = self.table.find(relpath[len(MIX_DIR) + 1:])
        if mix is None:
            return []
        return self._shards(self.table.entry(mix.spec.name, mix.names[0]), list(mix.names))

    def _listed_dir(self, name: str) -> Probe:
        """``.mix/NAME`` in a listing of ``.mix``; one whose files cannot be read now is shown
        for the owner of the source's root alone (its lookup reports why)."""
        try:
            got = self._mix_dir(name)
        except (MixError, OSError):
            got = None
        if got is not None:
            return got
        root = self.tree.nodes[ROOT].st
        return self._dir(name, Access(root.st_mode & 0o500, root.st_uid, root.st_gid))

    def probe(self, relpath: str) -> Probe | None:
        return self.look(os.path.dirname(relpath), os.path.basename(relpath))
