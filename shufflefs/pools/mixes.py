"""Which files each mixture (``[[mix]]``) draws from, read from the source tree, and the names
of its shards under ``MNT/.mix/NAME/``.

A mixture's files are its sources' files, source after source, each source's in `path_order`:
the members of one pool whose records a `mix_index.MixIndex` picks from every epoch.  All of
them must be data files of one format (a reader of the shards reads one format), each source
must match at least one, and no file may belong to two sources; Parquet files must share one
schema (their footers are read when the mixture is found).  Blocking (the store's
listings); resolved again at most once per `TREE_TTL` seconds, members' stamps after
`STAMP_TTL`, as `lookup.PoolTable` does.  Its shards, and ``.mix/NAME`` itself, are readable only
by whoever may read every file and enter every directory on the way to one (`access`).
"""

from __future__ import annotations

import posixpath
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..config import MIX_DIR, MixSpec
from ..errors import ShuffleError
from ..formats import FormatRule
from ..index.table import SourceStamp
from ..sources.base import Store
from .access import Access
from .lookup import TREE_TTL, MemberStamps, walk
from .shards import path_order

_EXT = re.compile(r"(?:\.[A-Za-z][A-Za-z0-9]*)+$")


class MixError(ShuffleError):
    """A mixture that cannot be served as declared (its sources match no files, or files of
    several formats): the reason names the mixture and the files."""


@dataclass(frozen=True)
class MixSet:
    """A mixture's files as one pool (``members``, source after source; ``firsts``: where each
    source's files start among them, then their count) and its ``shards`` output files."""

    key: str
    members: tuple[str, ...]
    format: str
    spec: MixSpec
    firsts: tuple[int, ...]
    names: tuple[str, ...]
    """The shards' file names (``blend-00000-of-00004.jsonl``): a shard set's names."""
    shard_paths: tuple[str, ...]
    """The shards' relative paths (``.mix/blend/blend-00000-of-00004.jsonl``)."""
    shard_of: dict[str, int] = field(compare=False, repr=False)
    """Each shard's number by name."""
    declared = True

    @property
    def shards(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class MixEntry:
    """Output shard ``shard`` of a mixture, with its files' stamps: what a `lookup.PoolEntry` is
    for a pool's shard (the catalog serves both alike)."""

    pool: MixSet
    shard: int
    stamps: tuple[SourceStamp, ...]
    access: Access | None = None
    """Who may read the mixture's shards (`access.combine` over its files and their directories,
    read bits only)."""

    @property
    def mix(self) -> MixSet:
        return self.pool

    @property
    def shards(self) -> int:
        return self.pool.shards

    @property
    def shard_paths(self) -> tuple[str, ...]:
        return self.pool.shard_paths

    @property
    def epoch_path(self) -> str:
        """A mixture follows its own epoch, its first shard's, as a pool's shards do: set on any
        of its shards (then on all of them), on ``.mix/NAME`` or ``.mix``, or the mount's."""
        return self.shard_paths[0]

    @property
    def epoch_paths(self) -> tuple[str, ...]:
        return self.shard_paths


def mixture_files(spec: MixSpec, files: list[str], format_key: Callable[[str], str | None]) -> MixSet:
    """The mixture ``spec`` over the source tree's ``files``; `MixError` if it cannot be served."""
    where = f"mixture {spec.name!r}"
    owner: dict[str, int] = {}
    members: list[str] = []
    firsts = [0]
    for i, source in enumerate(spec.sources):
        rule = FormatRule(source.glob, "none")
        got = sorted((p for p in files if rule.matches(p) and format_key(p) is not None), key=path_order)
        if not got:
            raise MixError(MIX_DIR, None, f"{where}: source #{i + 1} ({source.glob!r}) matches no data file")
        for p in got:
            if p in owner:
                raise MixError(MIX_DIR, None, f"{where}: {p} matches source #{owner[p] + 1} "
                               f"({spec.sources[owner[p]].glob!r}) and #{i + 1} ({source.glob!r}); "
                               "a file belongs to one source")
            owner[p] = i
        members.extend(got)
        firsts.append(len(members))
    kinds: dict[str, str] = {}
    for p in members:
        kinds.setdefault(format_key(p) or "", p)
    if len(kinds) > 1:
        seen = "; ".join(f"{p} is {k}" for k, p in kinds.items())
        raise MixError(MIX_DIR, None, f"{where}: its files differ in format ({seen}); all files of a mixture must share one "
                       "format and its parameters")
    found = _EXT.search(posixpath.basename(members[0]))
    ext, n, key = found.group(0) if found else "", spec.shards or len(members), f"{MIX_DIR}/{spec.name}"
    names = tuple(f"{spec.name}-{i:05d}-of-{n:05d}{ext}" for i in range(n))
    return MixSet(key, tuple(members), next(iter(kinds)), spec, tuple(firsts), names,
                  tuple(f"{key}/{name}" for name in names), {name: i for i, name in enumerate(names)})


PARQUET = "parquet"


def same_schema(store: Store, mix: MixSet) -> None:
    """A mixture of Parquet files: every file's schema must be the first's (one footer read per
    file); `MixError` naming the files if not, or a file that is no Parquet file."""
    from ..errors import FormatError
    from ..formats.parquet.footer import read_footer
    from .parquet_pool import check_schemas

    where = f"mixture {mix.spec.name!r}"
    footers = []
    for m in mix.members:
        f = store.open_file(m)
        try:
            size = store.stat(m, follow_last=True).st_size
            footers.append((store.path(m), read_footer(size, lambda a, b: f.read(a, b - a), store.path(m))))
        except FormatError as e:
            raise MixError(MIX_DIR, None, f"{where}: {e}") from None
        finally:
            f.close()
    try:
        check_schemas(footers, where)
    except FormatError as e:
        raise MixError(MIX_DIR, None, str(e)) from None


def walk_roots(globs: list[str]) -> list[str]:
    """The directories whose files ``globs`` can match: each glob's leading components without
    wildcards (``web/en/*.jsonl`` -> ``web/en``), or the whole tree (``""``) when a glob has no
    such component, or no ``/`` at all (it then matches file names anywhere)."""
    roots = set()
    for glob in globs:
        parts = glob.split("/")[:-1]
        fixed = []
        for part in parts:
            if any(c in part for c in "*?[") or part in ("", ".", ".."):
                break
            fixed.append(part)
        if not fixed:
            return [""]
        roots.add("/".join(fixed))
    # a root inside another is walked with it
    return sorted(r for r in roots if not any(r.startswith(o + "/") for o in roots))


class MixTable:
    """The mixtures of a mount as found in its source tree now."""

    def __init__(self, store: Store, format_key: Callable[[str], str | None], specs: list[MixSpec]) -> None:
        self.store, self.format_key = store, format_key
        self.specs = {s.name: s for s in specs}
        self._lock = threading.Lock()
        self._tree: tuple[float, list[str]] | None = None
        self._found: dict[str, MixSet | MixError] = {}  # for the files of ``_tree``
        self._dirs: Mapping[str, Access] = {}  # the directories' modes, as ``_tree`` was walked
        self._stamps = MemberStamps(store, 256, lambda: self._dirs)

    def _files(self) -> list[str]:
        now = time.monotonic()
        if self._tree is None or now - self._tree[0] > TREE_TTL:
            roots = walk_roots([s.glob for spec in self.specs.values() for s in spec.sources])
            seen: dict[str, Access] = {}
            files = sorted({f for root in roots for f in self._walk(root, seen)})
            if self._tree is None or files != self._tree[1]:
                self._found.clear()
            self._tree, self._dirs = (now, files), seen
        return self._tree[1]

    def _walk(self, root: str, seen: dict[str, Access]) -> list[str]:
        """The files beneath ``root``; ``seen`` takes the modes of the directories beneath it
        and of ``root`` and those above it (one stat each, per walk)."""
        parts = root.split("/") if root else []
        for i in range(len(parts)):
            d = "/".join(parts[: i + 1])
            try:
                seen[d] = Access.of(self.store.stat(d))
            except (FileNotFoundError, NotADirectoryError):
                return []
        return walk(self.store, root, seen)

    def find(self, name: str) -> MixSet | None:
        """Mixture ``name`` (None: no such mixture); `MixError` if it cannot be served."""
        spec = self.specs.get(name)
        if spec is None:
            return None
        with self._lock:
            files = self._files()
            got = self._found.get(name)
            if got is None:
                try:
                    got = mixture_files(spec, files, self.format_key)
                    if got.format.startswith(PARQUET + "("):
                        same_schema(self.store, got)
                except MixError as e:
                    got = e
                self._found[name] = got
        if isinstance(got, MixError):
            raise MixError(got.path, None, got.message)
        return got

    def entry(self, name: str, shard_name: str) -> MixEntry | None:
        """The entry of shard ``shard_name`` of mixture ``name``, or None if there is none."""
        mix = self.find(name)
        shard = None if mix is None else mix.shard_of.get(shard_name)
        if shard is None:
            return None
        with self._lock:
            known = self._stamps.get((mix.key, mix.members), mix.members)
        access = known.access  # a shard is no file to write or run: its read bits
        return MixEntry(mix, shard, known.stamps, Access(access.mode & 0o444, access.uid, access.gid))

    def note(self, mix: MixSet, got: tuple[tuple[SourceStamp, ...], tuple[Access, ...]] | None) -> None:
        """The files' stamps and modes as just read (an open found one changed), as `PoolTable.note`."""
        self._stamps.note((mix.key, mix.members), mix.members, got)

    def stale(self) -> None:
        """A file changed: read every mixture's files' versions again at the next lookup."""
        self._stamps.stale()

    def check(self) -> list[str]:
        """What keeps any mixture from being served now (empty: all can be)."""
        problems = []
        for name in self.specs:
            try:
                self.find(name)
            except MixError as e:
                problems.append(e.message)
        return problems
