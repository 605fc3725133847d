"""The one-node model's arithmetic (tools/bench/node_model.py): limits, the bound, reply threads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench import node_model as nm  # noqa: E402

GiB = 1 << 30
C = nm.Costs(trio=0.1, reply=0.2, build=0.5, reader=0.2, cold=0.25)


def test_warm_limits_are_threads_over_cost() -> None:
    p = nm.warm(C, nm.Node(cores=32, reply_threads=2, build_threads=4, mem_bw=80e9, copies=4))
    assert p.limits["trio thread"] == pytest.approx(GiB / 0.1)
    assert p.limits["reply threads"] == pytest.approx(2 * GiB / 0.2)
    assert p.limits["build threads"] == pytest.approx(4 * GiB / 0.5)
    assert p.limits["cores"] == pytest.approx(32 * GiB / 1.0)
    assert p.limits["memory bandwidth"] == pytest.approx(10e9)
    assert (p.bound, p.rate) == ("build threads", pytest.approx(8 * GiB))


def test_no_reply_threads_puts_the_copy_on_the_trio_thread() -> None:
    p = nm.warm(C, nm.Node(cores=2, reply_threads=0, build_threads=2))
    assert "reply threads" not in p.limits
    assert p.limits["trio thread"] == pytest.approx(GiB / 0.3)
    assert p.bound == "cores" and p.rate == pytest.approx(2 * GiB / 1.0)


def test_cold_adds_the_insertion_to_the_builds_and_caps_at_the_disk() -> None:
    node = nm.Node(cores=32, reply_threads=2, build_threads=4, mem_bw=1e12, disk=3e9)
    p = nm.cold(C, node)
    assert p.limits["build threads"] == pytest.approx(4 * GiB / 0.75)
    assert (p.bound, p.rate) == ("disk", 3e9)
    assert nm.cold(C, nm.Node(cores=32, build_threads=4, mem_bw=1e12)).bound == "build threads"


def test_gets_in_flight_follow_round_trip_and_connection_rate() -> None:
    link = nm.Link(rate=12.5e9, conn_rate=80e6, rtt=0.03, get_bytes=2_400_000, in_flight=16)
    assert nm.get_rate(link) == pytest.approx(16 * 2_400_000 / 0.06)
    p = nm.remote(C, nm.Node(cores=32), nm.Link(cpu=1.0, trio=0.5, in_flight=16))
    assert p.bound == "GETs in flight"
    many = nm.remote(C, nm.Node(cores=32), nm.Link(cpu=1.0, trio=0.5, in_flight=4096))
    assert (many.bound, many.rate) == ("trio thread", pytest.approx(GiB / 0.5))


def test_one_reader_is_the_serial_sum_below_the_saturated_rate() -> None:
    node = nm.Node(cores=32, reply_threads=2, build_threads=4)
    assert nm.one_reader(C, node) == pytest.approx(GiB / 0.5)
    slow = nm.Costs(trio=0.01, reply=0.01, build=4.0, reader=0.01)
    assert nm.one_reader(slow, node) == pytest.approx(nm.warm(slow, node).rate)


def test_run_queue_waits_lengthen_the_serial_chain() -> None:
    node = nm.Node(cores=32, reply_threads=2, build_threads=4)
    assert nm.one_reader(C, node, waits=0.5) == pytest.approx(GiB / 1.0)


def test_threads_are_told_apart_by_id_and_name() -> None:
    from bench.node import by_kind, merged, Run

    a = {10: ("shufflefs", 1.0, 1.0, 0.0), 11: ("Trio thread 0", 0.0, 0.0, 0.0), 12: ("shufflefs", 0.0, 0.0, 0.0)}
    b = {10: ("shufflefs", 1.5, 1.25, 0.5), 11: ("Trio thread 0", 0.25, 0.5, 0.0), 12: ("shufflefs", 0.0, 1.0, 0.25),
         13: ("Trio thread 1", 0.5, 0.0, 0.0)}  # a thread born between the snapshots counts from zero
    kinds = by_kind(10, a, b)
    assert kinds == {"trio": (0.5, 0.25, 0.5), "build": (0.75, 0.5, 0.0), "other": (0.0, 1.0, 0.25)}
    x = Run("a", {"trio": (1.0, 0.0)}, (0.0, 1.0), [1.0], [2.0], wait={"trio": 1.0})
    y = Run("b", {"trio": (3.0, 2.0)}, (1.0, 1.0), [3.0], [4.0], wait={"trio": 3.0})
    m = merged([x, y])
    assert m.cpu == {"trio": (2.0, 1.0)} and m.reader == (0.5, 1.0) and m.rates == [1.0, 3.0] and m.wait == {"trio": 2.0}


def test_object_storage_counts_the_daemon_whole() -> None:
    p = nm.remote(C, nm.Node(cores=8, reply_threads=0), nm.Link(cpu=1.8, trio=0.5, in_flight=4096, rate=1e12))
    assert "reply threads" not in p.limits
    assert p.limits["trio thread"] == pytest.approx(GiB / 0.5)
    assert p.limits["cores"] == pytest.approx(8 * GiB / 2.0)
