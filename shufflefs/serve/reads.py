"""Reads of an open view: a handle remembers the window it is reading, so a read inside it is one
slice of the window's buffer (no lookup, no await).  Entering a window holds it for the handle
and, for a sequential reader, starts loading the next ones (`WindowCache.ahead_windows`: two, or
for a remote source its measured bandwidth x latency)."""

from __future__ import annotations

import errno
import logging
import weakref
from typing import Any

import trio

from ..windows.cache import Slot, WindowCache
from ..windows.container import Container, container_of
from ..windows.layout import HEADER, TRAILER
from .nodes import Handle, Node
from .replies import Replies
from .views import Views
from .workers import Timeout

log = logging.getLogger("shufflefs")


PEEK_BYTES = 1 << 20
"""The largest read a window not loaded may answer from its pages alone (`Reads._peeks`): the
largest request the kernel sends through the page cache."""


SPARE_BUFFERS, SPARE_BYTES = 4, 1 << 20
"""Buffers kept for joining a read's pieces, and the size they are made at (the largest request
the kernel sends through the page cache; larger direct_io reads get one of their own)."""


class MemoryWait(Timeout):
    """A read waited past the window deadline for memory, not for its source: the message
    says which limit and what holds it."""

    def __init__(self, what: str, deadline: float, pressure: str) -> None:
        OSError.__init__(self, errno.ETIMEDOUT, f"no memory for {what} within {deadline:g} s ({pressure})")


class Reads:
    def __init__(self, views: Views, windows: WindowCache, compiled: bool = True, threads: int | None = 0) -> None:
        self.views, self.windows = views, windows
        self.replies = Replies(compiled, threads)
        windows.recycled, windows.touched = self.replies.recycled, self.replies.touch
        self.peeks = 0  # reads answered by `ParquetView.peek`
        # compressed views: the checksums of the container units reads left unfinished, per view
        self._memos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._spare: list[bytearray] = []  # buffers that joined a read's pieces, free again (`_assembly`)
        self._lent: list[bytearray] = []  # buffers returned with a read: free once the next read starts

    async def read(self, h: Handle, off: int, size: int) -> Any:
        """The view bytes ``[off, off+size)`` for handle ``h`` (a buffer, not a copy when it
        can be a slice of one window)."""
        if self._lent:  # their replies went out before any other task ran: pyfuse3 awaits nothing
            # between a read's return and its reply
            self._spare = (self._spare + [b for b in self._lent if len(b) == SPARE_BYTES])[-SPARE_BUFFERS:]
            self._lent.clear()
        container = container_of(h.node.fmt)
        sequential = h.continues(off, off + size)
        if container is not None:
            return await self._read_packed(h, container, off, size, sequential)
        return await self._read_plain(h, off, size, sequential)

    async def _read_packed(self, h: Handle, container: Container, off: int, size: int, sequential: bool) -> bytearray:
        """A compressed file's view: the bytes of its plain view that ``[off, off+size)`` shows
        (or checksums), in their container (`windows.container`); the plain view's windows are
        loaded, held and read ahead as for any view."""
        plain = h.node.layout.size
        memo = self._memos.setdefault(h.node.view, {})
        for attempt in (memo, None):  # without the memo if what it planned from went meanwhile
            lo, hi = container.plain_range(off, size, plain, attempt)
            data: Any = await self._read_plain(h, lo, hi - lo, sequential) if hi > lo else b""
            try:
                return container.render(off, size, plain, lo, data, attempt)
            except LookupError:
                continue
        raise AssertionError("a read planned without a memo needs none")

    async def _read_plain(self, h: Handle, off: int, size: int, sequential: bool | None = None) -> Any:
        """Bytes ``[off, off+size)`` of the plain view; ``sequential``: the read continues the
        handle's last one (default: it starts where that ended)."""
        if h.lo <= off and off + size <= h.hi and h.slot.data is not None:
            # inside the window this handle is reading (held: loaded, and its bytes are only
            # taken away by a read that needed the memory, which also clears ``data``)
            at = off - h.lo + h.shift
            h.slot.used = trio.current_time()  # still read: not idle (see WindowCache.room)
            return memoryview(h.slot.data)[at: at + size]
        return await self._read_windows(h, off, size, sequential)

    async def _read_windows(self, h: Handle, off: int, size: int, sequential: bool | None = None) -> Any:
        """The bytes of ``[off, off+size)``, when they are not all in the handle's window.

        A read takes its windows one at a time, and a handle lets go of its window before it
        waits for another: so a handle never needs more than one window of the memory limit, and
        readers of more views than fit take turns instead of waiting for each other (a read across
        a window boundary copies the first window's tail before it asks for the next)."""
        node = h.node
        pieces = node.layout.pieces(off, size)
        if not pieces:
            return b""
        view = node.view.view
        sequential = off == h.last_end if sequential is None else sequential
        out: memoryview | None = None
        pos, entered, data = 0, False, None
        for p in pieces:
            if p.part == HEADER:
                data = memoryview(view.header)[p.lo: p.hi]
            elif p.part == TRAILER:
                data = memoryview(view.trailer)[p.lo: p.hi]
            else:
                ref = self.views.window(node, p.part, sequential)
                if self._peeks(node, ref, p.hi - p.lo, sequential):
                    data = memoryview(await self.views.workers.run(view.peek, p.part, p.lo, p.hi,
                                                                   limiter=self.windows.limiter))
                    self.peeks += 1
                else:
                    if h.slot is not None and h.slot.key != ref.key:
                        self.leave(h)
                    slot = await self._acquire(node, p.part, ref)
                    try:
                        entered = self._hold(h, p.part, slot, ref.shift) or entered
                        data = memoryview(slot.data)[p.lo + ref.shift: p.hi + ref.shift]
                        if len(pieces) > 1:  # copied before the window may be recycled
                            out = self._join(out, pieces, pos, data)
                    finally:
                        self.windows.release(slot)
                    pos += p.hi - p.lo
                    continue
            if len(pieces) > 1:
                out = self._join(out, pieces, pos, data)
            pos += p.hi - p.lo
        if entered and sequential and h.slot is not None:
            n = self.windows.ahead_windows(h.slot.owner, h.slot.nbytes)
            for ref in self.views.ahead(node, h.k, n):
                self.windows.prefetch(ref.key, ref.nbytes, ref.loader, ref.work)
        if out is None:
            return data
        self._lent.append(out.obj)
        return out

    def _join(self, out: memoryview | None, pieces: list, pos: int, data: memoryview) -> memoryview:
        """``data`` placed at ``pos`` of the buffer a read of several pieces is joined in."""
        if out is None:
            out = self._assembly(sum(q.hi - q.lo for q in pieces))
        out[pos: pos + len(data)] = data
        return out

    def _assembly(self, n: int) -> memoryview:
        """``n`` bytes to join a read's pieces in: a spare buffer if one is large enough (a fresh
        megabyte costs its allocation, page faults and zeroing on every read across windows)."""
        for i, buf in enumerate(self._spare):
            if len(buf) >= n:
                del self._spare[i]
                return memoryview(buf)[:n]
        return memoryview(bytearray(max(n, SPARE_BYTES)))[:n]

    def offer(self, h: Handle) -> None:
        """After a read served: the handle's next reads inside its window may be answered by
        the compiled replies (`serve.replies`); a zstd view's too (they frame the plain view's
        bytes in raw blocks, a header every 128 KiB), not a gzip view's, whose reads take
        checksums."""
        container = container_of(h.node.fmt)
        if container is None:
            self.replies.offer(h)
        elif container.name == "zstd":
            self.replies.offer(h, plain=h.node.layout.size)

    def _peeks(self, node: Node, ref: Any, size: int, sequential: bool) -> bool:
        """Whether a read of ``size`` bytes of a window is answered from the pages it falls in
        (`ParquetView.peek`) rather than by loading the window: a small read that continues no
        read of its handle, of a window neither loaded nor loading, of a view that can (the
        windows of a Parquet file's own view)."""
        return (not sequential and size <= PEEK_BYTES and ref.key[0] == node.ino and ref.key not in self.windows
                and hasattr(node.view.view, "peek"))

    async def _acquire(self, node: Node, k: int, ref: Any) -> Slot:
        """Window k, loaded: `Timeout` (ETIMEDOUT) if that takes longer than the window deadline.
        The log line says why: a read still in line for memory names memory pressure (the limit
        and what holds it, `WindowCache.pressure`); a load that did not end, the source (the
        load itself runs on, and a later read waits for it again)."""
        deadline = self.views.workers.window_deadline
        windows = self.windows
        loading = False
        with trio.move_on_after(deadline):
            await windows.room(ref.key, ref.nbytes, ref.work)
            loading = True
            slot = windows.pin(ref.key, ref.nbytes, ref.loader, ref.work)
            try:
                await windows.wait(slot)
            except BaseException:
                windows.release(slot)
                raise
            return slot
        if not loading:
            raise MemoryWait(f"window {k} of {node.relpath}", deadline, windows.pressure())
        log.error("window %d of %s not loaded within %g s (is the source hung?): the read gets ETIMEDOUT",
                  k, node.relpath, deadline)
        raise Timeout(f"window {k} of {node.relpath}", deadline)

    def _hold(self, h: Handle, k: int, slot: Slot, shift: int = 0) -> bool:
        """``h`` now reads window k (starting ``shift`` bytes into ``slot``): hold it for the
        handle, letting go of the previous one.  True if that is a window change (a sequential
        reader then prefetches the next one, once the read's pins are gone, so that the window
        left behind can make room)."""
        if h.slot is slot:
            return False
        self.leave(h)
        self.windows.hold(slot)
        starts = h.node.layout.window_starts
        h.slot, h.k, h.lo, h.hi, h.shift = slot, k, int(starts[k]), int(starts[k + 1]), shift
        return True

    def leave(self, h: Handle) -> None:
        """The handle no longer reads its window (it may be dropped when memory is needed)."""
        self.replies.withdraw(h)
        if h.slot is not None:
            self.windows.unhold(h.slot)
            h.slot, h.k, h.lo, h.hi, h.shift = None, -1, 0, -1, 0
