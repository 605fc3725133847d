"""Views the kernel reads by itself: FUSE passthrough to a stage file.

Linux 6.9+ lets a FUSE server answer an open with a file on another filesystem, which the kernel
then reads for that handle (``read``, ``mmap``, splice) at the speed of the local disk: no read
request reaches the daemon.  The mount asks for it at INIT (`shufflefs._passthrough`: around
libfuse, which learned it in 3.16) when it runs with ``CAP_SYS_ADMIN`` (root), which registering
a backing file needs; ``shufflefs stat`` says whether it is on and why not.

A Parquet view uses it: its bytes are encoded once, front to back, into a stage file
(`stages.parquet_stage`) before its first handle is served, and every handle of the view (one
inode per epoch, `serve.tree`) reads the stage.  The stage is built by the epoch change's
preparation of the view (`epoch_prep`) when there is one, or at the mount's start (the file the
mount before read first, `last_order`), else by the first open, and goes with
the view (its handles keep reading it); while a view is read, the stage a reader will want next
is built (`EpochPrep.ahead`): the same file's in the next epoch, or of shards read one after the
other, the next two shards' (`Passthrough.next_of`).  A view whose stage cannot be made (no room
on the disk) is served by the daemon as without passthrough; a view whose source fails
(changed, damaged) fails its open as it would fail its reads.  Every other view is served by
the daemon.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from ..config import STAGE_WAIT
from ..errors import ShuffleError
from ..stages.parquet_stage import ParquetStage, StageFiles, kept_stage, write_stage
from ..stages.stage_keys import stage_key
from ..stages.parquet_view import ParquetView
from ..stages.kept_copies import CopyDisk
from ..stages.read_orders import ORDERS_DIR, load_order, save_order
from ..windows import heap
from .early_opens import EarlyOpens
from .nodes import VIEW, Node

log = logging.getLogger("shufflefs")

PASSTHROUGH_MODES = ("auto", "off")
"""``--passthrough``: ``auto`` asks the kernel for it when the daemon may register backing files
(root), ``off`` never."""


class Passthrough:
    """The mount's passthrough state and its views' stages."""

    def __init__(self, mode: str, lib: Any, disk: CopyDisk, stage_wait: float = STAGE_WAIT, source: str = "") -> None:
        """``disk``: the room rule of the node-local disk stages go on (with the decoded copies:
        copies kept for later mounts give way to stages too).  ``source``: the mount's root, by
        which the order of the files read is kept for the next mount (`stages.read_orders`)."""
        if mode not in PASSTHROUGH_MODES:
            raise ValueError(f"passthrough must be one of {', '.join(PASSTHROUGH_MODES)}: {mode!r}")
        self.mode, self.disk, self.source = mode, disk, source
        self.lib = lib if lib is not None and hasattr(lib, "passthrough_state") else None
        self.stages_built = self.stages_scattered = self.stages_kept = 0
        self.opens = 0
        self.refused: str | None = None  # why the last stage was not made
        self.disabled: str | None = None  # why passthrough is not used after all
        self._files: dict[str, StageFiles] = {}  # stage files for reuse, by directory
        self._registered: set[int] = set()  # handles whose stray reads the compiled replies answer
        self._reading: ParquetStage | None = None  # the stage opened last (`reading_ahead`)
        self.early = EarlyOpens(self, stage_wait)  # handles that read stages as they are written
        self._opened: dict[int, dict[tuple, None]] = {}
        """Files (relpath, part, parts) opened with a stage, in the order of their first opens, by
        epoch (the last few)."""
        self._before: list[tuple] = []  # the order the mount before kept (`last_order`)

    def ask(self) -> None:
        """Before mounting: ask for passthrough at INIT if it may be used."""
        if self.mode == "auto" and self.lib is not None and os.geteuid() == 0:
            self.lib.passthrough_enable()

    @property
    def on(self) -> bool:
        return self.lib is not None and self.disabled is None and bool(self.lib.passthrough_state()["on"])

    def why_not(self) -> str:
        if self.disabled is not None:
            return self.disabled
        if self.mode == "off":
            return "--passthrough off"
        if self.lib is None:
            return "the compiled replies are not built"
        if os.geteuid() != 0:
            return "the daemon is not root (registering a backing file needs CAP_SYS_ADMIN)"
        return str(self.lib.passthrough_state()["why_not"])

    def wants(self, node: Node) -> bool:
        """Whether ``node``'s opens are served by passthrough (its view is a Parquet view)."""
        return (self.on and node.kind == VIEW and node.view is not None
                and isinstance(node.view.view, ParquetView))

    async def stage(self, cat: Any, node: Node, threads: int = 2, made: str = "at its first open"
                    ) -> ParquetStage | None:
        """The stage an open of ``node`` is answered with (built once per view, by the first to
        ask), or None: the daemon serves it.  A stage that fails fails the open (`Reply`)."""
        if not self.wants(node):
            return None
        view = node.view.view  # type: ignore[union-attr]
        if view.stage is not None or view.unstaged:
            return view.stage
        if view.writer is not None and threads > 1:  # being built ahead: help
            self.help(cat, view.writer)
        try:
            return await self.built(cat, node, threads, made)
        except (ShuffleError, OSError) as e:
            raise cat.fail("open", node.relpath, node.epoch, None, e) from None

    async def built(self, cat: Any, node: Node, threads: int = 2, made: str = "at its first open"
                    ) -> ParquetStage | None:
        """``node``'s stage, built by the first to ask (one task per view: others wait for it), or
        None if there is no room for it; raises what failed it."""
        stage = await cat.tasks.run(("stage", node.ino), functools.partial(
            cat.workers.run, self.build, node, cat.views.parquet.copies.directory(), threads, made,
            limiter=cat.workers.index))
        if stage is None:  # served by the daemon from now on: an inode's opens never mix the two
            node.view.view.unstaged = True  # type: ignore[union-attr]
        return stage

    @staticmethod
    def help(cat: Any, writer: Any) -> None:
        """Another thread on the `StageWriter` ``writer`` (built ahead by one): a reader waits for it."""
        if cat.windows.nursery is not None:
            cat.windows.nursery.start_soon(functools.partial(cat.workers.run, writer.work, limiter=cat.workers.index))

    def build(self, node: Node, directory: str, threads: int = 2, made: str = "at its first open"
              ) -> ParquetStage | None:
        """Blocking: ``node``'s stage (made now if there is none), registered with the kernel;
        None if the disk has no room for it (its views are then served by the daemon)."""
        view: ParquetView = node.view.view  # type: ignore[union-attr]
        if view.stage is not None or view.unstaged:
            return view.stage
        files = self._files.get(directory)
        if files is None:
            files = self._files[directory] = StageFiles(directory, self.disk.kept)
            heap.keep_top(heap.STAGE_TRIM_THRESHOLD)
        key = stage_key(view)
        stage = kept_stage(view, files, key)  # before `room_for`, which may remove it for room
        if stage is None:
            why = self.disk.room_for(view.size)
            if why is not None:
                self.refused = why
                log.info("%s (epoch %d): no stage for passthrough: %s; served by the daemon", node.relpath, node.epoch,
                         why)
                return None
            stage = write_stage(view, files, threads, key)  # others may help it (`stage`)
        try:
            stage.backing_id = self.lib.backing_open(stage.fd)
        except OSError as e:  # (EPERM in a user namespace): no passthrough for this mount
            stage.close()
            self.disabled = f"the kernel refused a backing file: {e.strerror}"
            log.warning("FUSE passthrough off: %s; Parquet views are served by the daemon", self.disabled)
            return None
        except BaseException:
            stage.close()
            raise
        stage.release_id = self.lib.backing_close
        stage.made = made if not stage.kept else f"{made}: written {stage.kept}, kept"
        view.stage = stage
        view.closers.append(stage.close)
        self.stages_built += 1
        self.stages_scattered += stage.scattered
        self.stages_kept += bool(stage.kept)
        log.debug("%s (epoch %d): stage of %d bytes for passthrough in %.2f s", node.relpath, node.epoch, stage.size,
                  stage.seconds)
        return stage

    def next_of(self, this: tuple, epoch: int, known: int | None = None) -> tuple[str, tuple[int, int], int] | None:
        """The file (relpath, (part, parts)) and epoch a reader will most likely open next with a
        stage after the file ``this`` (relpath, part, parts) at ``epoch``: the file first opened
        after it in the last epoch before ``known`` (default: ``epoch``) that opened any (after
        its last one: its first, in the next epoch), as readers of a set of shards open them in
        one order every epoch; with no epoch before, ``this`` in the next epoch if it is read
        alone.  None when that epoch did not open ``this``."""
        before = [e for e in self._opened if e < (epoch if known is None else known)]
        if not before and this not in self._before:
            alone = set(self._opened.get(epoch, {})) <= {this}
            return (this[0], this[1:], epoch + 1) if alone else None
        order = list(self._opened[max(before)]) if before else self._before
        if this not in order:
            return None
        i = order.index(this)
        nxt, epoch = (order[i + 1], epoch) if i + 1 < len(order) else (order[0], epoch + 1)
        return nxt[0], nxt[1:], epoch

    def attach(self, fh: int, stage: ParquetStage, node: Node | None = None) -> None:
        """The open about to be answered with file handle ``fh`` reads ``stage``.  Reads of the
        handle never reach the daemon, but the kernel's readahead of the view's own pages does
        (``POSIX_FADV_WILLNEED``, which pyarrow gives for every column chunk): the compiled
        replies answer those from the stage's mapping as far as it is in the page cache and refuse
        the rest (``stray``: read from disk here, they held the reader's hints back), the catalog
        (`ParquetStage.pread`) answers them otherwise."""
        self.lib.passthrough_open(fh, stage.backing_id)
        stage.read_ahead()
        self._reading = stage
        self.opens += 1
        if node is not None:
            self.note_open(node)
        if stage.size and self.lib.register(fh, 0, stage.size, stage.data, 0, [], -1, True):
            self._registered.add(fh)

    @property
    def reading_ahead(self) -> bool:
        """Whether the stage opened last is still asked from disk ahead of its reader
        (`ParquetStage.read_ahead`)."""
        return self._reading is not None and self._reading.reading_ahead

    def note_open(self, node: Node) -> None:
        """``node`` was opened to be read from its stage (`next_of` learns the order of files)."""
        self._opened.setdefault(node.epoch, {})[_file(node)] = None
        while len(self._opened) > 4:
            del self._opened[min(self._opened)]

    def detach(self, fh: int) -> None:
        """The handle ``fh`` is released (before its view, and so its stage, may close)."""
        self.early.release(fh)
        if fh in self._registered:
            self._registered.discard(fh)
            self.lib.unregister(fh)

    def last_order(self) -> tuple | None:
        """The first file (relpath, part, parts) the mount of this root before this one read with
        a stage, or None; `next_of` follows that mount's order until this one has its own."""
        if not self.on or not self.source:
            return None
        self._before = load_order(os.path.join(self.disk.root, ORDERS_DIR), self.source)
        return self._before[0] if self._before else None

    def close(self) -> None:
        """At unmount, once every view closed: the stage files kept for reuse, and the order of
        the files the last epoch read, for the next mount (`last_order`)."""
        for files in self._files.values():
            files.close()
        self._files.clear()
        if self._opened and self.source:
            save_order(os.path.join(self.disk.root, ORDERS_DIR), self.source, list(self._opened[max(self._opened)]))

    def describe(self) -> dict[str, Any]:
        files = sum(f.made - f.closed for f in self._files.values())
        return {"on": self.on, **({} if self.on else {"why_not": self.why_not()}),
                "stages_built": self.stages_built, "stages_scattered": self.stages_scattered,
                "stages_kept": self.stages_kept, "opens": self.opens, "early_opens": self.early.opened,
                "stage_files": files,
                "stage_files_reused": sum(f.reused for f in self._files.values()),
                "stage_files_made": sum(f.made for f in self._files.values()),
                **({"refused": self.refused} if self.refused else {})}


def _file(node: Node) -> tuple:
    return node.relpath, node.part, node.parts
