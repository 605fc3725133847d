"""The inode table and what the source tree shows: directory probes, the ``.parts`` directories.

Inodes.  A data file gets one inode number per (path, epoch, source version, loader part), never
reused (its key), so every ``open`` resolves the epoch current at that moment while a handle
opened earlier stays on its own inode and keeps its epoch.  Directories, symbolic links and
pass-through files have one inode per path.  Old inodes disappear when the kernel forgets them.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat

from ..config import MountConfig
from ..formats import Format, resolve_format
from ..sources.base import Store
from .nodes import DIR, MAX_PARTS, ROLE_COUNT, ROLE_PARTS, ROOT, Node, Probe, Reply

log = logging.getLogger("shufflefs")

FORMAT_MEMO = 100_000
"""Paths whose format is remembered (resolving one walks the rules)."""


class Tree:
    """Nodes by inode number and by key; probes of the store's entries (blocking, for threads)."""

    def __init__(self, store: Store, config: MountConfig) -> None:
        self.store = store
        self.config = config
        self.nodes: dict[int, Node] = {}
        self.keys: dict[tuple, int] = {}
        self._next_ino = ROOT + 1
        self._formats: dict[str, Format | None] = {}
        root = Node(ROOT, DIR, "", ("d", ""), store.stat("", follow_last=True))
        root.lookups = 1
        self.nodes[ROOT] = root
        self.keys[root.key] = ROOT

    def node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise Reply(errno.ESTALE)
        return node

    def find(self, key: tuple) -> Node | None:
        ino = self.keys.get(key)
        return None if ino is None else self.nodes[ino]

    def add(self, kind: str, relpath: str, key: tuple, st: os.stat_result) -> Node:
        node = Node(self._next_ino, kind, relpath, key, st)
        self._next_ino += 1
        self.nodes[node.ino] = node
        self.keys[key] = node.ino
        return node

    def remove(self, node: Node) -> None:
        if self.keys.get(node.key) == node.ino:
            del self.keys[node.key]
        self.nodes.pop(node.ino, None)

    def format(self, relpath: str) -> Format | None:
        if relpath not in self._formats:
            if len(self._formats) > FORMAT_MEMO:
                self._formats.clear()
            self._formats[relpath] = resolve_format(relpath, self.config.rules, self.config.format_defaults)
        return self._formats[relpath]

    def format_key(self, relpath: str) -> str | None:
        """Files pool only with files of the same format and parameters."""
        fmt = self.format(relpath)
        return repr(fmt) if fmt is not None else None

    # ------------------------------------------------------------------ probes (blocking)

    def probe(self, relpath: str, name: str) -> Probe | None:
        """Describe one entry, or None if it is hidden (outside links, devices, ...)."""
        try:
            st = self.store.stat(relpath)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):  # a directory on the way became a link
                log.warning("%s: a directory on its path is a symbolic link now; not followed", relpath)
                return None
            raise
        if stat.S_ISDIR(st.st_mode):
            return Probe(name, st, None, None, None)
        if stat.S_ISLNK(st.st_mode):
            target = self.store.link_target(relpath)
            return Probe(name, st, None, None, target) if target is not None else None
        if not stat.S_ISREG(st.st_mode):
            return None
        fmt = self.format(relpath)
        last = None
        if fmt is not None and st.st_size > 0:
            try:
                f = self.store.open_file(relpath)
                try:
                    b = f.read(st.st_size - 1, 1)
                finally:
                    f.close()
                last = b[0] if b else None
            except OSError:
                last = None  # unreadable: open will report the error
        return Probe(name, st, fmt, last, None)

    def list(self, relpath: str) -> list[Probe]:
        """The visible entries of a directory, sorted by name."""
        out = []
        for name in sorted(self.store.list(relpath)):
            p = self.probe(os.path.join(relpath, name) if relpath else name, name)
            if p is not None:
                out.append(p)
        return out

    # ------------------------------------------------------------------ the split directories

    def up_key(self, node: Node) -> tuple:
        """The key of a directory's parent (the split directories lead back to the root)."""
        if node.role == ROLE_PARTS:
            return ("d", "")
        if node.role == ROLE_COUNT:
            return ("P",)
        suffix = () if node.parts == 1 else (node.part, node.parts)
        if node.relpath == "" and node.parts > 1:
            return ("P", node.parts)
        return ("d", os.path.dirname(node.relpath), *suffix)

    def split_dir(self, parent: Node, name: str) -> Node:
        """``.parts``, ``.parts/K`` and ``.parts/K/i`` (the root of part i's tree): made on
        lookup; ``.parts`` and ``.parts/K`` list nothing (any K up to `MAX_PARTS` exists)."""
        if parent.role is None:
            key, role, space = ("P",), ROLE_PARTS, (0, 1)
        else:
            if not re.fullmatch(r"[1-9][0-9]{0,4}|0", name):
                raise Reply(errno.ENOENT)
            k = int(name)
            if parent.role == ROLE_PARTS:
                if not 1 <= k <= MAX_PARTS:
                    raise Reply(errno.ENOENT)
                key, role, space = ("P", k), ROLE_COUNT, (0, k)
            else:
                if k >= parent.parts:
                    raise Reply(errno.ENOENT)
                key, role, space = ("d", "", k, parent.parts), None, (k, parent.parts)
        node = self.find(key)
        if node is not None:
            return node
        node = self.add(DIR, "", key, self.nodes[ROOT].st)
        node.role = role
        node.part, node.parts = space
        return node

