"""One node's single daemon, on paper: what it serves from measured CPU per GiB and stated limits.

Pure arithmetic (no mounts, no timings): `tools/bench/node.py` measures the costs, and
``tests/pure/test_node_model.py`` checks the sums.  Every stage is CPU-seconds per GiB served
by one kind of thread; a thread kind of ``n`` threads serves at most ``n / cost`` GiB/s, the
node's cores at most ``cores / (all costs)``, and the assumed limits (memory bandwidth, disk,
link, GETs in flight) cap the rest.  The smallest limit is where the node saturates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1 << 30
GB = 1e9


@dataclass(frozen=True)
class Costs:
    """CPU-seconds per GiB served, each stage on its own kind of thread (measured)."""

    trio: float
    """The thread that receives FUSE requests (libfuse + Python per window, compiled replies elsewhere)."""
    reply: float
    """Reply threads: writev of each reply into the kernel (the page cache of the view)."""
    build: float
    """Window build threads (local source: pread into a scratch + gather + framing check)."""
    reader: float
    """The reading process (a data loader on the same node): the copy out of the page cache."""
    python_read: float = 0.0
    """Trio-thread CPU per GiB when Python answers every read instead (--python-replies)."""
    cold: float = 0.0
    """Extra build-thread CPU per GiB when the source is not in the page cache (insertion, I/O setup)."""


@dataclass(frozen=True)
class Node:
    """The node and the daemon's threads; the rates and copies are assumptions unless measured."""

    cores: int = 32
    reply_threads: int = 2
    build_threads: int = 4
    mem_bw: float = 100 * GB
    """Bytes a second the node's memory sustains for copies (read + write counted), an assumption."""
    copies: float = 4.0
    """Copies of every served byte (build: 2, reply: 1, reader: 1 for a gathered view), each one a
    read and a write of memory."""
    disk: float | None = None
    """Bytes a second the source's disk delivers (cold), an assumption."""


@dataclass(frozen=True)
class Link:
    """Object storage: the link and the GETs, assumptions (the tool's defaults: the emulated link's)."""

    rate: float = 12.5 * GB
    """Bytes a second of the node's NIC (100 Gbit/s)."""
    conn_rate: float = 80e6
    """Bytes a second one connection (one GET) delivers."""
    rtt: float = 0.03
    get_bytes: int = 4 << 20
    in_flight: int = 16
    cpu: float = 0.0
    """The daemon's CPU-seconds per GiB served from GETs, all its threads (measured)."""
    trio: float = 0.0
    """Of which the thread that receives FUSE requests (measured)."""


@dataclass
class Projection:
    """Limits in bytes a second, by resource, and the one that binds."""

    limits: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return min(self.limits.values())

    @property
    def bound(self) -> str:
        return min(self.limits, key=self.limits.__getitem__)


def per_thread(cost: float, threads: float) -> float:
    """Bytes a second that ``threads`` threads, each ``cost`` CPU-s per GiB, can serve (inf if free)."""
    return float("inf") if cost <= 0 else threads * GiB / cost


def get_rate(link: Link) -> float:
    """Bytes a second ``in_flight`` GETs of ``get_bytes`` deliver: each takes rtt + bytes / conn_rate."""
    return link.in_flight * link.get_bytes / (link.rtt + link.get_bytes / link.conn_rate)


def warm(c: Costs, n: Node) -> Projection:
    """Source in the page cache: threads, cores and memory bandwidth."""
    trio = c.trio + (c.reply if n.reply_threads == 0 else 0.0)  # 0 reply threads: the trio thread writes
    p = Projection({"trio thread": per_thread(trio, 1), "build threads": per_thread(c.build, n.build_threads),
                    "cores": per_thread(c.trio + c.reply + c.build + c.reader, n.cores),
                    "memory bandwidth": n.mem_bw / (2 * n.copies)})
    if n.reply_threads:
        p.limits["reply threads"] = per_thread(c.reply, n.reply_threads)
    return p


def cold(c: Costs, n: Node) -> Projection:
    """Source on disk: the build threads also insert into the page cache, and the disk caps it."""
    p = warm(Costs(c.trio, c.reply, c.build + c.cold, c.reader), n)
    if n.disk:
        p.limits["disk"] = n.disk
    return p


def remote(c: Costs, n: Node, link: Link) -> Projection:
    """Object storage: the daemon's CPU per GiB of GETs (measured whole: its trio thread also writes
    the replies there, which the compiled replies do not answer), the GETs in flight, the NIC."""
    return Projection({"trio thread": per_thread(link.trio, 1), "cores": per_thread(link.cpu + c.reader, n.cores),
                       "GETs in flight": get_rate(link), "NIC": link.rate,
                       "memory bandwidth": n.mem_bw / (2 * n.copies)})


def one_reader(c: Costs, n: Node, waits: float = 0.0) -> float:
    """Bytes a second of one reader whose reads wait on each other: the reader's copy, the request
    and its reply in series (builds run ahead on their own threads), and never above `warm`.
    ``waits``: seconds per GiB those threads spent runnable but waiting for a CPU (a shared machine)."""
    serial = c.reader + c.trio + c.reply + waits
    return min(GiB / serial, warm(c, n).rate)
