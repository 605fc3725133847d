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
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from .. import resolve
from ..config import MountConfig
from ..errors import DESCRIPTOR_ERRNOS
from ..formats import Format, format_suffix, resolve_format
from ..index.table import SourceStamp
from ..pools.lookup import PoolTable
from ..pools.shards import shard_key
from ..sources.base import Store
from ..sources.local import LocalStore
from .nodes import DIR, MAX_PARTS, NO_POOL, ROLE_COUNT, ROLE_PARTS, ROOT, UNREAD, Node, Probe, Reply, Stat

log = logging.getLogger("shufflefs")

FORMAT_MEMO = 100_000
"""Paths whose format is remembered (resolving one walks the rules)."""
LISTING_TTL = 1.0
"""Seconds an entry's attributes from a listing answer lookups of its name without a stat: the
kernel keeps other entries' attributes as long (`fs.META_TIMEOUT`), and an open checks a view's
version anyway (`Catalog.open`)."""
LISTINGS = 8
"""Directories whose listing is kept (each until unused for `LISTING_IDLE` seconds)."""
LISTING_IDLE = 10.0
REMOTE_PROBES = 32
"""Entries of a remote store described at once (a stat from the listing, and a ranged GET of the
last byte of a text file: a round trip each; one at a time, ``ls -l`` of 100,000 objects 30 ms
away would take 50 minutes)."""
READ_AHEAD = 256
"""Entries of a kept listing described again by one lookup that needs a stat (see `Tree.look`)."""


def needs_last_byte(fmt: Format) -> bool:
    """Whether the view's size depends on the file's last byte (text without a final newline)."""
    return type(fmt).view_size is not Format.view_size


def _last_byte(pinned: int, size: int) -> int | None:
    """The last byte of the regular file held by the ``O_PATH`` descriptor ``pinned``, reopened
    through ``/proc/self/fd`` (the same inode: never a FIFO or device swapped in under its name);
    None if unreadable (the open reports the error, and its plan the size).  Out of descriptors it
    raises: a guess would announce a size the view may not have once descriptors are back."""
    try:
        fd = resolve.reopen(pinned)
    except OSError as e:
        if e.errno in DESCRIPTOR_ERRNOS:
            raise
        return None
    try:
        b = os.pread(fd, 1, size - 1)
        return b[0] if b else None
    except OSError:
        return None
    finally:
        os.close(fd)


class Tree:
    """Nodes by inode number and by key; probes of the store's entries (blocking, for threads)."""

    def __init__(self, store: Store, config: MountConfig) -> None:
        self.store = store
        self.config = config
        self.nodes: dict[int, Node] = {}
        self.keys: dict[tuple, int] = {}
        self._next_ino = ROOT + 1
        self._formats: dict[str, Format | None] = {}
        self._by_ext: dict[str, Format | None] = {}
        self.pools: PoolTable | None = None  # set by the catalog when files pool
        self._lock = threading.Lock()  # the listings: made and read on worker threads
        self._probes: ThreadPoolExecutor | None = None  # a remote store's entries, described side by side
        # dir -> [last used, probes, index by name, entries a background refresh reaches]
        self._listings: OrderedDict[str, list] = OrderedDict()
        root = Node(ROOT, DIR, "", ("d", ""), Stat(store.stat("", follow_last=True)))
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

    def add(self, kind: str, relpath: str, key: tuple, st: os.stat_result | Stat) -> Node:
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
        """The file's format.  Without rules it follows from the extension alone: one `Format`
        per extension, shared by every file that has it."""
        if not self.config.rules:
            ext = format_suffix(relpath)  # ``.jsonl.gz`` is not ``.csv.gz``
            if ext not in self._by_ext:
                self._by_ext[ext] = resolve_format(relpath, (), self.config.format_defaults)
            return self._by_ext[ext]
        if relpath not in self._formats:
            if len(self._formats) > FORMAT_MEMO:
                self._formats.clear()
            self._formats[relpath] = resolve_format(relpath, self.config.rules, self.config.format_defaults)
        return self._formats[relpath]

    def pool_key(self, relpath: str) -> str | None:
        """Files pool only with files of the same format and parameters."""
        fmt = self.format(relpath)
        return repr(fmt) if fmt is not None else None

    def format_key(self, relpath: str) -> str | None:
        """`pool_key` of the files a mixture may draw from (Parquet files too: their schemas
        are checked when the mixture is found, `pools.mixes`)."""
        return self.pool_key(relpath)

    # ------------------------------------------------------------------ probes (blocking)

    def _pool(self, relpath: str, fmt: Format | None, st: os.stat_result | Stat) -> object:
        """The pool entry of a data file (None: no pool); files whose names are no shard names
        skip the table unless globs are declared (they cannot be in a name-recognised set)."""
        pools = self.pools
        if pools is None or fmt is None or not stat.S_ISREG(st.st_mode):
            return None if pools is not None else NO_POOL
        if not pools.globs and shard_key(os.path.basename(relpath)) is None:
            return None
        return pools.find(relpath, SourceStamp.of(st))

    def _describe(self, relpath: str, name: str, st: os.stat_result, at: float) -> Probe | None:
        """A probe of an entry from its attributes alone (no read of the file), or None if hidden."""
        if stat.S_ISDIR(st.st_mode):
            return Probe(name, Stat(st), None, None, None, None, at)
        if stat.S_ISLNK(st.st_mode):
            target = self.store.link_target(relpath)
            return Probe(name, Stat(st), None, None, target, None, at) if target is not None else None
        if not stat.S_ISREG(st.st_mode):
            return None
        fmt = self.format(relpath)
        small = Stat(st)
        last = None if fmt is None or st.st_size == 0 or not needs_last_byte(fmt) else UNREAD
        return Probe(name, small, fmt, last, None, self._pool(relpath, fmt, small), at)

    def probe(self, relpath: str, name: str) -> Probe | None:
        """Describe one entry as it is now (attributes, last byte), or None if it is hidden
        (outside links, devices, ...)."""
        try:
            st = self.store.stat(relpath)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):
                log.warning("%s: a directory on its path is a symbolic link now; not followed", relpath)
                return None
            raise
        p = self._describe(relpath, name, st, time.monotonic())
        if p is not None and p.last_byte == UNREAD:
            self.read_last_byte(relpath, p)
        return p

    def read_last_byte(self, relpath: str, p: Probe) -> None:
        try:
            f = self.store.open_file(relpath)
            try:
                b = f.read(p.st.st_size - 1, 1)
            finally:
                f.close()
            p.last_byte = b[0] if b else None
        except OSError as e:
            if e.errno in DESCRIPTOR_ERRNOS:  # no guess: the size would be wrong once they are back
                raise
            p.last_byte = None  # unreadable: the open reports the error (and its plan the size)

    def list(self, relpath: str) -> list[Probe]:
        """The visible entries of a directory, sorted by name, from their attributes alone: one
        pass over the directory, no file opened (a listing must not cost a read per file).  Kept
        (`LISTINGS`) to answer the lookups a listing is followed by (``ls -l``) without a stat each."""
        at = time.monotonic()
        listed = getattr(self.store, "list_stat", None)
        if listed is not None:
            pairs = listed(relpath)
        else:
            pairs = []
            for name in self.store.list(relpath):
                try:
                    pairs.append((name, self.store.stat(os.path.join(relpath, name) if relpath else name)))
                except (FileNotFoundError, NotADirectoryError):
                    continue
        out = []
        prefix = relpath + "/" if relpath else ""
        for name, st in sorted(pairs, key=lambda p: p[0]):
            p = self._describe(prefix + name, name, st, at)
            if p is not None:
                out.append(p)
        with self._lock:
            for d in [d for d, got in self._listings.items() if at - got[0] > LISTING_IDLE]:
                del self._listings[d]
            self._listings[relpath] = [at, out, {p.name: i for i, p in enumerate(out)}, 0]
            self._listings.move_to_end(relpath)
            while len(self._listings) > LISTINGS:
                self._listings.popitem(last=False)
        return out

    def recent(self, relpath: str, name: str) -> Probe | None:
        """``name``'s probe in the kept listing of ``relpath`` if its attributes are younger than
        `LISTING_TTL` and it needs no read, else None (then `look`)."""
        with self._lock:
            got = self._listings.get(relpath)
            if got is None:
                return None
            now = time.monotonic()
            if now - got[0] > LISTING_IDLE:
                del self._listings[relpath]
                return None
            got[0] = now
            i = got[2].get(name)
            p = None if i is None else got[1][i]
        return p if p is not None and now - p.at <= LISTING_TTL and p.last_byte != UNREAD else None

    def look(self, relpath: str, name: str) -> tuple[Probe | None, bool]:
        """Blocking: ``(probe, fresh)`` of ``name`` in directory ``relpath`` as it is now.  A name
        of a kept listing is described again together with the next `READ_AHEAD` entries (one
        stat each, a read of the last byte where the size needs it), so that lookups in name
        order (``ls -l``) take one worker call per batch; the others' ``fresh`` is False."""
        with self._lock:
            got = self._listings.get(relpath)
            i = None if got is None else got[2].get(name)
        if i is None:
            return self.probe(os.path.join(relpath, name) if relpath else name, name), True
        return self.refresh(relpath, got, i), True

    def refresh(self, relpath: str, got: list, i: int) -> Probe | None:
        """Blocking: describe entry ``i`` of the kept listing ``got`` of ``relpath`` again, and
        the next `READ_AHEAD` entries whose attributes are stale or whose last byte is unread;
        entry ``i``'s new probe (None if it is gone: then no others)."""
        now = time.monotonic()
        todo = [j for j, p in enumerate(got[1][i: i + READ_AHEAD])
                if j == 0 or now - p.at > LISTING_TTL or p.last_byte == UNREAD]
        fresh = self.probe_names(relpath, [got[1][i + j].name for j in todo])
        if fresh[0] is None:  # gone (or its directory became a link): no batch
            return None
        for j, p in zip(todo, fresh):
            if p is not None:
                got[1][i + j] = p  # one list item: atomic for the trio thread reading it
        return fresh[0]

    def probe_names(self, relpath: str, names: list[str]) -> list[Probe | None]:
        """Blocking: `probe` of each of ``names`` in directory ``relpath``.  On local files the
        directory is reached beneath the root once and each name is then described relative to
        it, as `LocalStore.list_stat` does: one ``fstatat``, or for a text file an ``O_PATH``
        open whose ``fstat`` is the attributes and which is reopened to read the last byte."""
        if not names:
            return []
        if not isinstance(self.store, LocalStore):
            if len(names) == 1:
                return [self.probe(os.path.join(relpath, names[0]) if relpath else names[0], names[0])]
            with self._lock:
                if self._probes is None:
                    self._probes = ThreadPoolExecutor(REMOTE_PROBES, thread_name_prefix="probe")
            return list(self._probes.map(lambda n: self.probe(os.path.join(relpath, n) if relpath else n, n), names))
        try:
            dfd = resolve.open_path(self.store.path(relpath), resolve.O_PATH | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return [None] * len(names)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):
                log.warning("%s: a directory on its path is a symbolic link now; not followed", relpath)
                return [None] * len(names)
            raise
        try:
            at = time.monotonic()
            return [self._probe_at(dfd, relpath, name, at) for name in names]
        finally:
            os.close(dfd)

    def _probe_at(self, dfd: int, relpath: str, name: str, at: float) -> Probe | None:
        child = f"{relpath}/{name}" if relpath else name  # a listed name: no slash in it
        fmt = self.format(child)
        try:
            if fmt is None or not needs_last_byte(fmt):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                return self._describe(child, name, st, at)
            pinned = os.open(name, resolve.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(pinned)
            p = self._describe(child, name, st, at)
            if p is not None and p.last_byte == UNREAD:
                p.last_byte = _last_byte(pinned, st.st_size)
            return p
        finally:
            os.close(pinned)

    def ahead(self, relpath: str, name: str) -> tuple[list, int] | None:
        """``(listing, index)`` where a refresh should start in the background after a lookup of
        ``name`` answered from the kept listing of ``relpath``: half a batch ahead, if that entry
        is stale or unread and no refresh reaches it yet.  Lookups in name order then rarely
        wait for a batch."""
        with self._lock:
            got = self._listings.get(relpath)
            i = None if got is None else got[2].get(name)
            if i is None:
                return None
            j = i + READ_AHEAD // 2
            if j >= len(got[1]) or got[3] > j:
                return None
            p = got[1][j]
            if time.monotonic() - p.at <= LISTING_TTL and p.last_byte != UNREAD:
                return None
            got[3] = j + READ_AHEAD
            return got, j

    def forget_listed(self, relpath: str) -> None:
        """The kept listing of the directory of ``relpath`` is out of date (an open found the
        file changed): the next lookups stat again."""
        with self._lock:
            self._listings.pop(os.path.dirname(relpath), None)

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

