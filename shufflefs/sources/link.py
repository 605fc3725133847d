"""How many bytes a remote store needs in flight: the link's bandwidth x latency, measured.

A ranged GET of ``n`` bytes from a bucket takes about ``latency + n / conn_rate`` (10-100 ms of
round trip, then 50-100 MB/s per connection), so a reader that waits for one request at a time
gets a fraction of the link.  To read at the link's rate ``R`` it must keep ``R x (latency +
part / conn_rate)`` bytes requested and not yet arrived (Little's law), and no more: more only
holds memory, and queues behind the others.  Neither number is known in advance, so
`LinkMeter` measures them from the GETs themselves, the way BBR sizes a TCP window:

* the unloaded time of a `part`-sized GET: the shortest GET of about a part (half or more) in
  the last `MEMORY` seconds, one that queued behind few others (as GETs do while the
  readahead climbs; a link that the first GETs already fill looks as slow as they found it);
* the delivered rate: bytes of the GETs that ended over the last `HORIZON` seconds;
* in flight: `GAIN` x their product, between two parts and the cap (``--requests`` parts).

With `GAIN` above one, a link with room to spare delivers more as more is asked for, so the
target climbs until the link (or the reader) is what limits; at that point the delivered rate
stops growing and so does the target.  The unloaded time does not grow with queueing, so a full
link does not feed back into ever more requests.  Pure: the clock is an argument.
"""

from __future__ import annotations

import math
import threading
from collections import deque

HORIZON = 1.0
"""Seconds of finished GETs that make the delivered rate."""
GAIN = 2.0
"""Bytes in flight over the measured bandwidth x latency: room for the rate to grow."""
MEMORY = 30.0
"""Seconds of GETs that the latency and the per-connection rate are taken from: long enough to
remember the link unloaded while it is full (a full link slows every GET down, and a target
sized by loaded GETs would grow with the queue it makes)."""
RECOMPUTE = 0.01
"""Seconds an answer of `LinkMeter.in_flight` stands while no GET ends."""
SAMPLES = 4096
"""GETs remembered at most (the most recent)."""


class LinkMeter:
    """Thread-safe: GETs are recorded from the client's threads and read from the window cache's."""

    def __init__(self, part: int, cap_parts: int, start_parts: int = 4) -> None:
        self.part = int(part)
        self.cap = max(1, int(cap_parts)) * self.part
        self.floor = min(2 * self.part, self.cap)
        self.start = min(max(start_parts * self.part, self.floor), self.cap)
        self._gets: deque[tuple[float, float, int]] = deque(maxlen=SAMPLES)  # (started, ended, bytes)
        self._lock = threading.Lock()
        self._answer: tuple[float, int] | None = None  # (when, in_flight): asked on every window entered

    def record(self, started: float, ended: float, nbytes: int) -> None:
        """A GET that returned ``nbytes`` between the two times (seconds, one monotonic clock)."""
        with self._lock:
            self._gets.append((float(started), float(max(ended, started)), int(nbytes)))
            self._answer = None

    def estimate(self, now: float) -> tuple[float, float, float]:
        """``(latency s, seconds a part takes unloaded, delivered bytes/s)``; NaN where unmeasured
        (a part's time, when no GET was of about a part: record orders ask for a few KiB each)."""
        with self._lock:
            gets = [g for g in self._gets if g[1] >= now - MEMORY]
        if not gets:
            return math.nan, math.nan, math.nan
        latency = min(e - s for s, e, _ in gets)
        parts = [e - s for s, e, n in gets if 2 * n >= self.part]
        unloaded = min(parts) if parts else math.nan
        recent = [(s, e, n) for s, e, n in gets if e >= now - HORIZON]
        if not recent:
            return latency, unloaded, math.nan
        span = max(now - max(min(s for s, _, _ in recent), now - HORIZON), latency, 1e-3)
        return latency, unloaded, sum(n for _, _, n in recent) / span

    def in_flight(self, now: float) -> int:
        """Bytes to keep requested ahead of the reader (see the module docstring).  Computed
        again only after a GET ends or `RECOMPUTE` seconds later: a reader of small windows asks
        on every window, and the estimate walks up to `SAMPLES` GETs."""
        answer = self._answer
        if answer is not None and 0 <= now - answer[0] < RECOMPUTE:
            return answer[1]
        latency, unloaded, rate = self.estimate(now)
        if math.isnan(rate):
            got = self.start
        else:
            want = GAIN * rate * (latency if math.isnan(unloaded) else unloaded) + self.part
            got = int(min(max(want, self.floor), self.cap))
        self._answer = (now, got)
        return got
