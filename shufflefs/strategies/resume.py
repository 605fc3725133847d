"""Resuming an epoch after a stop, on the same or another number of ranks and loader parts.

A view is a pure function of (seed, epoch, layout), so a stopped job leaves nothing to lose: what
it consumed is the first ``consumed[r][i]`` records of each stream (rank r's part i).  A resume
state lists, per view file, the layouts the epoch ran under, in order, each with its consumed
counts; the counts of a later layout refer to the streams that layout was shown (the resumed
ones).  From it and the epoch's original streams this module computes, as pieces of those
streams, what each (rank, part) of the next layout shows:

* the rest of every stream after its consumed records;
* if the next layout is the last one's (same ranks and parts), each stream continues where it
  stopped, so a resumed view is byte for byte the rest of the uninterrupted one;
* otherwise the rests, in stream order, are cut into contiguous stretches: ranks get equal
  counts (within one record), and each rank's stretch is cut likewise into its parts.  A stretch
  is whole pieces of the old streams, never records interleaved, so a block order stays block
  reads.

Every record of the epoch's streams is then consumed or served exactly once, whatever the chain
of stops.  Pure integer work on pieces (a few per stream), no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .base import Plan
from .slices import SlicePlan
from .torn import stream_length
from .units import I64, share_edges

MAX_WORLD = 1 << 16
"""Ranks (and loader parts) a state may name: far beyond any job, small enough to refuse nonsense."""
MAX_STREAMS = 1 << 20
"""Streams (ranks x parts) one layout may have: the pieces of every one are computed when a view
opens, so a state of billions would hold a worker thread for minutes."""

Piece = tuple[int, int, int]
"""``(stream, lo, hi)``: records ``[lo, hi)`` of the epoch's original stream ``stream`` (rank r's
part i of the first layout is stream ``r * parts + i``)."""


class ResumeError(ValueError):
    """A resume state that cannot be applied (malformed, or counts beyond a stream's end)."""


@dataclass(frozen=True)
class Stop:
    """One layout an epoch ran under and how many records each of its streams consumed."""

    world: int
    parts: int
    consumed: tuple[tuple[int, ...], ...]
    """``consumed[r][i]``: records read from the front of rank r's part i."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.world, self.parts

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world, "parts": self.parts, "consumed": [list(c) for c in self.consumed]}


def _count(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ResumeError(f"{what} must be an integer from {low} to {high}, got {value!r}")
    return value


def _stop(raw: Any, where: str) -> Stop:
    if not isinstance(raw, Mapping):
        raise ResumeError(f"{where} must be an object with world_size, parts and consumed")
    unknown = set(raw) - {"world_size", "parts", "consumed"}
    if unknown:
        raise ResumeError(f"{where} has unknown keys {sorted(unknown)}")
    world = _count(raw.get("world_size", 1), f"{where}.world_size", 1, MAX_WORLD)
    parts = _count(raw.get("parts", 1), f"{where}.parts", 1, MAX_WORLD)
    if world * parts > MAX_STREAMS:
        raise ResumeError(f"{where}: {world} ranks x {parts} parts is more than {MAX_STREAMS} streams")
    consumed = raw.get("consumed")
    if not isinstance(consumed, list) or len(consumed) != world:
        raise ResumeError(f"{where}.consumed must be a list of {world} lists (one per rank)")
    rows = []
    for r, row in enumerate(consumed):
        if not isinstance(row, list) or len(row) != parts:
            raise ResumeError(f"{where}.consumed[{r}] must be a list of {parts} counts (one per part)")
        rows.append(tuple(_count(c, f"{where}.consumed[{r}][{i}]", 0, 1 << 62) for i, c in enumerate(row)))
    return Stop(world, parts, tuple(rows))


@dataclass(frozen=True)
class ResumeState:
    """An epoch to resume and, per view file (its path in the mount), the layouts it ran under."""

    epoch: int
    views: Mapping[str, tuple[Stop, ...]]

    @classmethod
    def from_json(cls, text: str | bytes, max_epoch: int = (1 << 31) - 1) -> ResumeState:
        """Parse and check a state (see docs/guide/resume.md); `ResumeError`
        says what is wrong and where."""
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ResumeError(f"not JSON: {e}") from None
        if not isinstance(raw, Mapping):
            raise ResumeError("a resume state is a JSON object with epoch and views")
        unknown = set(raw) - {"epoch", "views"}
        if unknown:
            raise ResumeError(f"unknown keys {sorted(unknown)}")
        epoch = _count(raw.get("epoch"), "epoch", 0, max_epoch)
        views = raw.get("views", {})
        if not isinstance(views, Mapping):
            raise ResumeError("views must be an object: view path -> list of layouts")
        out: dict[str, tuple[Stop, ...]] = {}
        for path, stops in views.items():
            name = normalize_path(path)
            if not isinstance(stops, list):
                raise ResumeError(f"views[{path!r}] must be a list of layouts")
            if name in out:
                raise ResumeError(f"views names {name!r} twice")
            out[name] = tuple(_stop(s, f"views[{path!r}][{j}]") for j, s in enumerate(stops))
        return cls(epoch, out)

    def to_json(self) -> str:
        return json.dumps({"epoch": self.epoch,
                           "views": {p: [s.to_json() for s in stops] for p, stops in self.views.items()}})

    def stops(self, relpath: str) -> tuple[Stop, ...]:
        """The layouts of one view file (none: it consumed nothing)."""
        return self.views.get(relpath, ())


def normalize_path(path: Any) -> str:
    """A view's path as the state names it: relative to the mount, ``/``-separated, no ``.``/``..``."""
    if not isinstance(path, str) or not path.strip("/"):
        raise ResumeError(f"a view path must be a non-empty string, got {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ResumeError(f"a view path may not contain '..': {path!r}")
    return "/".join(parts)


def _drop_front(pieces: list[Piece], n: int) -> list[Piece]:
    out = []
    for s, lo, hi in pieces:
        take = min(n, hi - lo)
        n -= take
        if lo + take < hi:
            out.append((s, lo + take, hi))
    return out


def _take(pieces: list[Piece], lo: int, hi: int) -> list[Piece]:
    """Records ``[lo, hi)`` of the concatenation of ``pieces``."""
    out, at = [], 0
    for s, a, b in pieces:
        n = b - a
        x, y = max(lo - at, 0), min(hi - at, n)
        if x < y:
            out.append((s, a + x, a + y))
        at += n
        if at >= hi:
            break
    return out


def _cut(pieces: list[Piece], world: int, parts: int) -> list[list[Piece]]:
    """The stretches of (rank, part), rank-major: ranks within one record of each other, and each
    rank's parts within one record of each other."""
    total = sum(hi - lo for _, lo, hi in pieces)
    ranks = share_edges(total, world)
    out = []
    for r in range(world):
        lo, hi = int(ranks[r]), int(ranks[r + 1])
        split = share_edges(hi - lo, parts)
        out.extend(_take(pieces, lo + int(split[i]), lo + int(split[i + 1])) for i in range(parts))
    return out


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if out and out[-1][0] == p[0] and out[-1][2] == p[1]:
            out[-1] = (p[0], out[-1][1], p[2])
        else:
            out.append(p)
    return out


def _check(stop: Stop, streams: list[list[Piece]], j: int) -> None:
    for r in range(stop.world):
        for i in range(stop.parts):
            have = sum(hi - lo for _, lo, hi in streams[r * stop.parts + i])
            if stop.consumed[r][i] > have:
                raise ResumeError(f"layout {j} ({stop.world} ranks, {stop.parts} parts): rank {r} part {i} "
                                  f"consumed {stop.consumed[r][i]} records, but its view holds {have}")


def _walk(lengths: Sequence[int], stops: Sequence[Stop], last: tuple[int, int]) -> tuple[list[Piece], list[list[Piece]]]:
    """Along ``stops``: the pieces they consumed, and the streams of the layout ``last`` after them."""
    if len(lengths) != (stops[0].world * stops[0].parts if stops else last[0] * last[1]):
        shape = stops[0].shape if stops else last
        raise ResumeError(f"{len(lengths)} streams for a first layout of {shape[0]} x {shape[1]}")
    streams = [[(s, 0, int(n))] if n else [] for s, n in enumerate(lengths)]
    consumed: list[Piece] = []
    for j, stop in enumerate(stops):
        _check(stop, streams, j)
        counts = [stop.consumed[k // stop.parts][k % stop.parts] for k in range(len(streams))]
        consumed.extend(p for st, c in zip(streams, counts) for p in _take(st, 0, c))
        rests = [_drop_front(st, c) for st, c in zip(streams, counts)]
        shape = stops[j + 1].shape if j + 1 < len(stops) else last
        streams = rests if shape == stop.shape else _cut([p for st in rests for p in st], *shape)
    return consumed, [_merge(st) for st in streams]


def resumed_pieces(lengths: Sequence[int], stops: Sequence[Stop], world: int, parts: int) -> list[list[Piece]]:
    """What each (rank, part) of a layout of ``world`` ranks and ``parts`` parts shows, rank-major
    (index ``rank * parts + part``), after ``stops``; ``lengths``: the records of every original
    stream, which are the first stop's (rank-major too).  Without stops: the original streams."""
    return _walk(lengths, stops, (world, parts))[1]


def consumed_pieces(lengths: Sequence[int], stops: Sequence[Stop]) -> list[Piece]:
    """Every piece of the original streams that ``stops`` consumed (for checks and `stat`)."""
    return _walk(lengths, stops, stops[-1].shape if stops else (1, len(lengths)))[0] if stops else []


class ResumedPlan(Plan):
    """A resumed view: stretches of the epoch's original plans, one after the other, each keeping
    its windows (clipped at the stretch's ends), so the view reads what those plans read."""

    def __init__(self, first: Plan, pieces: Sequence[tuple[Plan, int, int]], rank: int, world: int,
                 part: int = 0, parts: int = 1) -> None:
        super().__init__(first.index, first.spec, first.epoch, rank, world, part, parts)
        self.name = first.name  # type: ignore[misc]
        self.first = first
        self.pieces = [SlicePlan(p, lo, hi) for p, lo, hi in pieces]
        # the plans read from (a pool shard's: its stream), each once: what the resume holds in memory
        self.sources = list({id(q): q for q in (p.inner if isinstance(p, SlicePlan) else p for p, _, _ in pieces)}.values())
        counts = [p.n_windows for p in self.pieces]
        self._firsts = np.concatenate([[0], np.cumsum(counts, dtype=I64)]).astype(I64)
        self._sizes = np.concatenate([p.window_sizes for p in self.pieces] or [np.zeros(0, I64)]).astype(I64)
        self._records = np.concatenate([p.window_records for p in self.pieces] or [np.zeros(0, I64)]).astype(I64)

    @property
    def window_sizes(self) -> np.ndarray:
        return self._sizes

    @property
    def window_records(self) -> np.ndarray:
        return self._records

    def _at(self, k: int) -> tuple[SlicePlan, int]:
        if not 0 <= k < self.n_windows:
            raise IndexError(f"window {k} outside 0..{self.n_windows - 1}")
        j = int(np.searchsorted(self._firsts, k, side="right")) - 1
        return self.pieces[j], k - int(self._firsts[j])

    def window(self, k: int) -> np.ndarray:
        piece, w = self._at(k)
        return piece.window(w)

    def window_runs(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        piece, w = self._at(k)
        return piece.window_runs(w)

    def describe(self) -> dict:
        """The strategy's facts, with this view's place and what it resumes (a pls partition's
        exchange counts describe the first layout's view, not this one: left out)."""
        out = {k: v for k, v in self.first.describe().items() if k not in ("kept", "received", "sent")}
        return {**out, **super().describe(), "resumed": True, "pieces": len(self.pieces),
                "records_shown": int(self._records.sum())}


PlanOf = Callable[[int, int, int, int], Plan]
"""``plan_of(rank, world, part, parts)``: the epoch's original plan of one stream of a layout."""


LengthOf = Callable[[int, int, int, int], "int | None"]
"""``length_of(rank, world, part, parts)``: the records of that stream, or None if only its plan
can tell."""


def share_length(records: int, rank: int, world: int, part: int, parts: int, torn: int = 0) -> int:
    """Records of rank ``rank``'s part ``part`` when a layout cuts ``records`` at equal counts,
    ranks first and then each rank's parts (the first ones one more), the last ``torn`` of them
    kept for the last stream (`torn.TornLast`): what every strategy's plans hold without
    ``--even`` and ``--balance`` (checked against them by the tests)."""
    ranks = share_edges(records - torn, world)
    split = share_edges(int(ranks[rank + 1] - ranks[rank]), parts)
    return stream_length(int(split[part + 1] - split[part]), torn, rank, world, part, parts)


def resumed_plan(plan_of: PlanOf, stops: Sequence[Stop], rank: int, world: int, part: int = 0,
                 parts: int = 1, length_of: LengthOf | None = None) -> Plan:
    """What rank ``rank``'s part ``part`` of a layout of ``world`` x ``parts`` shows after
    ``stops``: the plain plan without stops, else a `ResumedPlan` over the first layout's plans.

    When every layout was this one, only this stream's plan is made (its rest is all it shows);
    otherwise the first layout's streams' lengths come from ``length_of`` (else from planning
    each once), and only the plans the view reads from are made."""
    if not stops:
        return plan_of(rank, world, part, parts)
    first, me = stops[0], rank * parts + part
    if all(s.shape == (world, parts) for s in stops):
        own = plan_of(rank, world, part, parts)
        n = int(np.asarray(own.window_records).sum())
        lengths = [0] * (world * parts)
        lengths[me] = n
        done = 0
        for j, stop in enumerate(stops):
            c = stop.consumed[rank][part]
            if done + c > n:
                raise ResumeError(f"layout {j} ({world} ranks, {parts} parts): rank {rank} part {part} consumed "
                                  f"{c} records, but its view holds {n - done}")
            done += c
        return ResumedPlan(own, [(own, done, n)] if done < n else [], rank, world, part, parts)
    lengths = []
    for s in range(first.world * first.parts):
        r, i = divmod(s, first.parts)
        n = length_of(r, first.world, i, first.parts) if length_of is not None else None
        lengths.append(int(np.asarray(plan_of(r, first.world, i, first.parts).window_records).sum()) if n is None else n)
    pieces = resumed_pieces(lengths, stops, world, parts)[me]
    plans: dict[int, Plan] = {}
    for s, _, _ in pieces:
        if s not in plans:
            r, i = divmod(s, first.parts)
            plans[s] = plan_of(r, first.world, i, first.parts)
    template = next(iter(plans.values()), None) or plan_of(0, first.world, 0, first.parts)
    return ResumedPlan(template, [(plans[s], lo, hi) for s, lo, hi in pieces], rank, world, part, parts)
