"""The readahead of a remote source follows the link's bandwidth x latency: it starts small,
climbs while the link has room, settles near GAIN x the link's bandwidth-delay product once
the link is full (not growing with the queueing it causes), and stays between its floor and
the --requests cap."""

from __future__ import annotations

import math

import pytest

from shufflefs.sources.link import GAIN, LinkMeter

MiB = 1 << 20
PART = 8 * MiB


def simulate(latency: float, conn: float, link: float, cap_parts: int = 64, seconds: float = 12.0,
             dt: float = 0.002) -> tuple[LinkMeter, list[tuple[float, int, float]]]:
    """A link that gives each GET ``latency`` then at most ``conn`` bytes/s, all of them together
    at most ``link``; a reader that keeps ``meter.in_flight`` bytes of PART-sized GETs going.
    Returns the meter and (time, bytes in flight, delivered bytes/s over the last second)."""
    meter = LinkMeter(PART, cap_parts)
    active: list[list[float]] = []  # [started, bytes left]
    done: list[tuple[float, int]] = []
    trace = []
    t = 0.0
    while t < seconds:
        while len(active) * PART < meter.in_flight(t):
            active.append([t, float(PART)])
        moving = [a for a in active if t - a[0] >= latency]
        if moving:
            share = min(conn, link / len(moving)) * dt
            for a in moving:
                a[1] -= share
        for a in [a for a in active if a[1] <= 0]:
            active.remove(a)
            meter.record(a[0], t + dt, PART)
            done.append((t + dt, PART))
        t += dt
        delivered = sum(n for e, n in done if e > t - 1.0)
        trace.append((t, len(active) * PART, delivered))
    return meter, trace


def test_no_gets_yet_starts_with_a_few_parts():
    m = LinkMeter(PART, 16)
    assert m.in_flight(0.0) == 4 * PART
    assert math.isnan(m.estimate(0.0)[0])


def test_floor_and_cap():
    m = LinkMeter(PART, 16)
    m.record(0.0, 0.001, 100)  # a fast tiny GET, long ago: nothing recent
    assert m.in_flight(100.0) == 4 * PART
    for i in range(64):  # a huge delivered rate: capped at --requests parts
        m.record(10.0, 10.5 + i * 0.001, PART)
    assert m.in_flight(10.6) == 16 * PART
    slow = LinkMeter(PART, 16)
    slow.record(0.0, 2.0, MiB)  # 0.5 MiB/s: the floor of two parts
    assert slow.in_flight(2.0) == 2 * PART


def test_latency_and_a_parts_time_are_measured():
    m = LinkMeter(PART, 16)
    m.record(0.0, 0.03, 1000)  # latency only
    m.record(0.0, 0.03 + PART / 80e6, PART)  # latency + a part at 80 MB/s
    m.record(0.1, 0.5, PART)  # a part that queued
    latency, unloaded, rate = m.estimate(0.6)
    assert latency == pytest.approx(0.03)
    assert unloaded == pytest.approx(0.03 + PART / 80e6)
    assert rate > 0


@pytest.mark.parametrize("latency,conn,link", [(0.03, 80e6, 400e6), (0.1, 50e6, 1e9), (0.01, 100e6, 200e6),
                                               (0.001, 1e9, 1e9)])
def test_a_reader_following_the_meter_fills_the_link_without_hoarding(latency, conn, link):
    meter, trace = simulate(latency, conn, link)
    end = trace[-1][0]
    last = [x for x in trace if x[0] > end - 3.0]
    # the last three seconds (GETs started together end together: one second is noisy)
    delivered = sum(x[2] for x in trace if any(abs(x[0] - (end - k)) < 1e-3 for k in (0, 1, 2))) / 3
    assert delivered >= 0.85 * min(link, meter.cap / (latency + PART / conn)), (delivered, link)
    # once the link is full, what is in flight stays near GAIN x the bandwidth-delay product as
    # the first GETs found it (4 parts at once: on a fast link they already share it), not
    # growing with the queueing it causes
    seen = latency + max(PART / conn, 4 * PART / link)
    # (on average over those seconds, x 1.25: the rate is measured over one second of whole parts)
    held = sum(x[1] for x in last) / len(last)
    assert held <= 1.25 * GAIN * link * seen + 2 * PART, (held, link * seen)
    assert max(x[1] for x in last) <= meter.cap


def test_queueing_does_not_inflate_the_readahead():
    # both saw the link unloaded first (GETs of 30 ms + 100 ms), then deliver the same rate
    # with GETs that queue 4x longer in one: the target does not follow the queue
    fast, slow = LinkMeter(PART, 256), LinkMeter(PART, 256)
    for m in (fast, slow):
        m.record(0.0, 0.03, 1000)
        m.record(0.0, 0.13, PART)
    for i in range(40):
        end = 1.0 + i * 0.025
        fast.record(end - 0.13, end, PART)
        slow.record(end - 0.52, end, PART)
    assert slow.in_flight(2.0) <= 1.05 * fast.in_flight(2.0)


def test_what_the_link_was_like_long_ago_is_forgotten():
    m = LinkMeter(PART, 256)
    m.record(0.0, 0.001, 1000)  # a 1 ms link, 40 s ago
    m.record(39.0, 39.1, 1000)
    assert m.estimate(40.0)[0] == pytest.approx(0.1)
    assert m.estimate(80.0)[0] != m.estimate(80.0)[0]  # NaN: nothing measured lately
