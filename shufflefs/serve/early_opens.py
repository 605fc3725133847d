"""Opens of a Parquet view whose stage is still being written after `STAGE_WAIT`: answered then.

A view read by the kernel (`serve.passthrough`) needs its whole stage before the kernel may read
it, and a stage is the view's every byte: 2.25 GiB for a 1 GiB file of text that snappy halves,
written in 0.6-2.9 s here, and a file of 10 GiB takes ten times that.  An open whose stage is
not written within `STAGE_WAIT` (an epoch jumped to, the first epoch of a mount, data larger
than memory) is answered as a file the daemon serves, and the daemon answers its reads from the
stage as far as it is written (the footer first, then the last window, which holds the end that
readers read first, then front to back): the compiled replies from the part written from the
start, Python a read past it once the writer got there.  A reader so gets its footer and first
row group in the time of a few windows.

The kernel does not let one inode have handles it caches and handles it passes through at
once (the second kind of open fails with ``ETXTBSY``), so while such a handle is open every
open of the view is answered the same way, even after the stage is done; once they are all
closed, opens are passed through again.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import numpy as np
import trio

from ..config import STAGE_WAIT
from ..errors import ShuffleError
from ..stages.parquet_stage import StageWriter
from .nodes import Node

log = logging.getLogger("shufflefs")

WAIT = 0.002
"""Seconds between looks at a stage being written."""


class EarlyOpen:
    """A handle that reads its view's stage as it is written: the view, the stage's bytes (an
    array over the stage file's mapping) and the writer, or None once the stage is done."""

    def __init__(self, node: Node, data: np.ndarray, writer: StageWriter | None) -> None:
        self.node, self.data, self.writer = node, data, writer
        self.size = len(data)
        self.offered = 0  # the end of the bytes the compiled replies answer

    @property
    def whole(self) -> bool:
        return self.writer is None or self.node.view.view.stage is not None

    def written(self, off: int, end: int) -> bool:
        return self.whole or self.writer.written(off, end)  # type: ignore[union-attr]

    @property
    def written_end(self) -> int:
        return self.size if self.whole else self.writer.written_end  # type: ignore[union-attr]


class EarlyOpens:
    """The mount's handles that read stages as they are written (`EarlyOpen`), by file handle."""

    def __init__(self, passthrough: Any, wait: float = STAGE_WAIT) -> None:
        """``wait``: `STAGE_WAIT` (``--stage-wait``)."""
        self.passthrough, self.wait = passthrough, wait
        self.handles: dict[int, EarlyOpen] = {}
        self.opened = 0  # opens answered so, since the mount

    async def open(self, cat: Any, node: Node) -> EarlyOpen | None:
        """An `EarlyOpen` of ``node`` if its stage is not written within ``wait`` (started
        now if no one started it), or if other early handles of it are open; else None: its
        opens are passed through (`Passthrough.stage` gives the stage, or the error that failed
        it) or the daemon serves the view (no room for a stage)."""
        view = node.view.view  # type: ignore[union-attr]
        if view.unstaged or cat.windows.nursery is None:
            return None
        failed: list[BaseException] = []
        if view.stage is None:
            key, mine = ("stage", node.ino), trio.Event()
            if view.writer is None and not cat.tasks.running(key):
                cat.windows.nursery.start_soon(self._build, cat, node, failed, mine)
            else:
                mine.set()
                if view.writer is not None:  # being built ahead, by one thread: help
                    self.passthrough.help(cat, view.writer)
            deadline = trio.current_time() + self.wait
            while view.stage is None and not failed and (not mine.is_set() or cat.tasks.running(key)) and (
                    view.writer is None or trio.current_time() < deadline or not view.writer.early_reads):
                await trio.sleep(WAIT)
        if failed:
            raise cat.fail("open", node.relpath, node.epoch, None, failed[0])
        writer, stage = view.writer, view.stage
        if stage is not None:
            if not view.early:
                return None
            got = EarlyOpen(node, stage.data, None)
        elif writer is not None:
            writer.shared = True  # before the look below: a stage that fails from now on keeps its file
            data = writer.data
            while len(data) != view.size or writer.failed:  # finished meanwhile: its outcome decides
                await trio.sleep(WAIT)
                if view.writer is not writer:
                    return await self.open(cat, node)
            got = EarlyOpen(node, data, writer)
        else:
            return None  # its build ended without a stage: `Passthrough.stage` tells why
        view.early += 1
        self.opened += 1
        self.passthrough.note_open(node)
        if writer is not None:
            cat.windows.nursery.start_soon(self._ahead_when_written, cat, node)
        else:
            cat.prep.ahead(node)
        return got

    async def _ahead_when_written(self, cat: Any, node: Node) -> None:
        """Once ``node``'s stage is written, the stages its reader will open next are built
        (`EpochPrep.ahead`): not beside it, where they would take its CPU."""
        view = node.view.view  # type: ignore[union-attr]
        while view.stage is None and (view.writer is not None or cat.tasks.running(("stage", node.ino))):
            await trio.sleep(10 * WAIT)
        if view.stage is not None:
            cat.prep.ahead(node)

    async def _build(self, cat: Any, node: Node, failed: list[BaseException], ended: trio.Event) -> None:
        """The stage of ``node`` made in the background, the view kept open meanwhile."""
        node.opens += 1
        try:
            await self.passthrough.built(cat, node)
        except (ShuffleError, OSError) as e:
            failed.append(e)  # the open, or the reads of its handles, report it
            log.debug("%s (epoch %d): its stage failed: %s", node.relpath, node.epoch, e)
        except Exception as e:  # noqa: BLE001 -- a background task must never end the mount
            log.exception("%s (epoch %d): its stage failed", node.relpath, node.epoch)
            failed.append(OSError(errno.EIO, f"its stage failed: {e}"))
        finally:
            ended.set()
            node.opens -= 1
            if node.opens == 0:
                cat.views.retire(node)

    def attach(self, fh: int, early: EarlyOpen) -> None:
        self.handles[fh] = early
        self._offer(fh, early)

    def get(self, fh: int | None) -> EarlyOpen | None:
        return None if fh is None else self.handles.get(fh)

    async def read(self, cat: Any, h: Any, early: EarlyOpen, off: int, size: int) -> bytes:
        """The view's bytes [off, off + size) for handle ``h``, once written; a failed stage
        fails the read."""
        end = min(off + size, early.size)
        if off >= end:
            return b""
        while not early.written(off, end):
            writer = early.writer
            if writer is not None and writer.failed:
                node = early.node
                raise cat.fail("read", node.relpath, node.epoch, off, writer.failed[0])
            await trio.sleep(WAIT)
        self._offer(h.fh, early)
        data = bytes(early.data[off:end])
        cat.stats.served(len(data), early.node.relpath, h.opened)
        return data

    def _offer(self, fh: int, early: EarlyOpen) -> None:
        """Let the compiled replies answer the handle's reads of the bytes written so far."""
        lib, end = self.passthrough.lib, early.written_end
        if lib is None or end <= early.offered:
            return
        if early.offered:
            lib.unregister(fh)
        early.offered = end if lib.register(fh, 0, end, early.data, 0, []) else 0

    def release(self, fh: int) -> None:
        early = self.handles.pop(fh, None)
        if early is None:
            return
        if early.offered and self.passthrough.lib is not None:
            self.passthrough.lib.unregister(fh)
        early.node.view.view.early -= 1  # type: ignore[union-attr]
