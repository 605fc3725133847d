"""Which epoch each file is at: the mount's, unless a directory or the file (or its pool) has its
own, set through ``user.shufflefs.epoch``; and whether the mount's epoch is a resumed one
(``user.shufflefs.resume``: a `ResumeState` the files at the mount's epoch follow, until the next
epoch is set).  Also remembers the files opened most recently, whose next epoch's view is prepared
as soon as their epoch changes."""

from __future__ import annotations

import errno
import logging
import os
from collections import OrderedDict

from ..strategies.resume import ResumeState, Stop
from .nodes import DIR, VIEW, Node, Reply

log = logging.getLogger("shufflefs")

RECENT_FILES = 4
"""Files opened most recently whose window 0 is loaded ahead when their epoch changes: at most
as many as idle views are kept (a prepared view waits there for its first open)."""


class Epochs:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.files: dict[str, int] = {}
        self.dirs: dict[str, int] = {}
        self.resume: ResumeState | None = None
        self.resume_gen = 0  # counts the states set, so that every one shows views of its own
        self._recent: OrderedDict[tuple[str, int, int], None] = OrderedDict()  # (relpath, part, parts), newest last

    def of(self, relpath: str) -> int:
        """A file's own override, else the nearest directory's, else the mount's epoch."""
        if relpath in self.files:
            return self.files[relpath]
        if not self.dirs:  # asked for every entry of a listing and every lookup
            return self.epoch
        d = relpath  # a directory's own setting first (then its parents')
        while d:
            if d in self.dirs:
                return self.dirs[d]
            d = os.path.dirname(d)
        return self.epoch

    def _overridden(self, relpath: str) -> bool:
        if relpath in self.files:
            return True
        d = os.path.dirname(relpath)
        while True:
            if d in self.dirs:
                return True
            if not d:
                return False
            d = os.path.dirname(d)

    def resumed(self, relpath: str, epoch_path: str) -> tuple[int, tuple[Stop, ...]]:
        """``(state number, layouts)`` of the view of ``relpath`` (which follows the epoch of
        ``epoch_path``) when it resumes; ``(0, ())`` when it shows its epoch from the start: no
        state, a file or directory epoch of its own, or a view the state says consumed nothing."""
        if self.resume is None or self._overridden(epoch_path):
            return 0, ()
        stops = self.resume.stops(relpath)
        return (self.resume_gen, stops) if stops else (0, ())

    def resumed_shard(self, relpath: str, members: tuple[str, ...], epoch_path: str | None = None
                      ) -> tuple[int, tuple[Stop, ...], str | None]:
        """`resumed` for a shard of the pool (or mixture) whose shards are ``members`` and
        whose epoch is ``epoch_path``'s (default: the first shard's), plus a problem (else None).  The
        shards of a pool cut the pool's streams by position, so a shard the state does not name
        still ran under its siblings' layouts, consuming nothing: it resumes with their shapes
        (else, under another layout, it would show records its siblings showed before).  Named
        shards must agree on their layouts."""
        if self.resume is None or self._overridden(epoch_path or members[0]):
            return 0, (), None
        stops = self.resume.stops(relpath)
        named = {m: self.resume.stops(m) for m in members if self.resume.stops(m)}
        shapes = {tuple(s.shape for s in st) for st in named.values()}
        if len(shapes) > 1:
            return self.resume_gen, stops or next(iter(named.values())), (
                "the pool's shards in the resume state ran under different layouts: "
                + "; ".join(f"{m}: {[s.shape for s in st]}" for m, st in sorted(named.items())))
        if stops:
            return self.resume_gen, stops, None
        if not named:
            return 0, (), None
        zeros = tuple(Stop(s.world, s.parts, tuple((0,) * s.parts for _ in range(s.world)))
                      for s in next(iter(named.values())))
        return self.resume_gen, zeros, None

    def set_resume(self, state: ResumeState) -> None:
        """Every file goes to the state's epoch, resuming the views the state names."""
        self.epoch = state.epoch
        self.files.clear()
        self.dirs.clear()
        self.resume = state
        self.resume_gen += 1
        log.info("epoch of every file set to %d, resuming %d view(s) after the layouts they ran under",
                 state.epoch, len(state.views))

    def shown(self, node: Node) -> int:
        """The epoch ``user.shufflefs.epoch`` reads on a node."""
        if node.kind == DIR:
            return self.epoch if node.relpath == "" else self.of(node.relpath)
        return node.epoch

    def set(self, node: Node, epoch: int) -> None:
        """Set the epoch of everything under a directory, of a view's file, or of its pool."""
        if node.kind == DIR and node.relpath == "":  # the root, or a part tree's root
            self.epoch = epoch
            self.files.clear()
            self.dirs.clear()
            if self.resume is not None:
                log.info("resume state of epoch %d cleared", self.resume.epoch)
            self.resume = None
            log.info("epoch of every file set to %d", epoch)
        elif node.kind == DIR:
            prefix = node.relpath + "/"
            for d in (self.files, self.dirs):
                for p in [p for p in d if p.startswith(prefix)]:
                    del d[p]
            self.dirs[node.relpath] = epoch
            log.info("epoch of files under %s set to %d", node.relpath, epoch)
        elif node.kind == VIEW and node.pool is not None:  # a pool's shards share its epoch
            for m in node.pool.epoch_paths:
                self.files[m] = epoch
            log.info("epoch of the pool %s set to %d", node.pool.pool.key, epoch)
        elif node.kind == VIEW:
            self.files[node.relpath] = epoch
            log.info("epoch of %s set to %d", node.relpath, epoch)
        else:
            raise Reply(errno.ENOTSUP)

    def overrides(self) -> dict[str, int]:
        return {**{d + "/": e for d, e in self.dirs.items()}, **self.files}

    def opened(self, node: Node) -> None:
        recent = (node.relpath, node.part, node.parts)
        self._recent[recent] = None
        self._recent.move_to_end(recent)
        while len(self._recent) > RECENT_FILES:
            self._recent.popitem(last=False)

    def moved(self, node: Node) -> list[tuple[str, tuple[int, int]]]:
        """The recently opened files (newest first) whose epoch setting on ``node`` moved."""
        prefix = node.relpath + "/" if node.kind == DIR else None
        everything = node.kind == DIR and node.relpath == ""
        members = node.pool.shard_paths if node.pool is not None else ()
        return [(relpath, (part, parts)) for relpath, part, parts in reversed(self._recent)
                if everything or relpath == node.relpath or (prefix and relpath.startswith(prefix))
                or relpath in members]
