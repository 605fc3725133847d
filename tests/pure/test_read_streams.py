"""Level: pure.  A handle tells reads that continue one of its last few reads (each stream of a
reader that reads several at once) from reads that jump (`Handle.continues`)."""

from __future__ import annotations

from shufflefs.serve.nodes import STREAMS, Handle


def test_interleaved_streams_are_each_sequential() -> None:
    h = Handle(None)  # type: ignore[arg-type]
    assert h.continues(0, 100)  # a handle's first read at 0 continues nothing read yet: the start
    a, b = 1000, 50_000
    assert not h.continues(a, a + 10) and not h.continues(b, b + 10)
    for k in range(1, 20):  # two threads' reads arriving alternately
        assert h.continues(a + 10 * (k - 1) + 10, a + 10 * k + 10)
        assert h.continues(b + 10 * (k - 1) + 10, b + 10 * k + 10)


def test_a_jump_and_a_repeat_are_not_sequential() -> None:
    h = Handle(None)  # type: ignore[arg-type]
    assert h.continues(0, 4096)
    assert not h.continues(10_000, 14_096)
    assert not h.continues(0, 4096)  # read again from the start: its end was consumed
    assert h.continues(4096, 8192)


def test_only_the_last_streams_are_remembered() -> None:
    h = Handle(None)  # type: ignore[arg-type]
    starts = [100_000 * (k + 1) for k in range(STREAMS + 1)]
    for s in starts:
        assert not h.continues(s, s + 10)
    assert not h.continues(starts[0] + 10, starts[0] + 20)  # the oldest stream was forgotten
    assert h.continues(starts[-1] + 10, starts[-1] + 20)
