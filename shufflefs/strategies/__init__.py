"""Shuffle strategies: each turns (index, spec, epoch, rank, world) into a `Plan`.

Every plan is a pure function of its inputs; randomness comes only from `base.rng` keyed by the
seed, the epoch (except `once`), a per-use salt and, where ranks differ, the rank.  Unit
permutations are drawn without the rank, so every rank sees the same list and takes a disjoint
contiguous piece of it.  Pure numpy, no I/O but `costs` (the record costs of ``--balance``):
imports `index.table`, and `quality.metrics` when an expected label mix is asked for.
"""

from __future__ import annotations

import numpy as np

from ..index.table import RecordIndex
from .balance import BalancedPlan
from .base import EVEN_MODES, LOCAL_MODES, Plan, ShuffleSpec, rng
from .baselines import NoShufflePlan, ShuffleOncePlan
from .corgipile import BlockOnlyPlan, CorgiPilePlan
from .even import EvenPlan
from .lirs import FullShufflePlan, PageShufflePlan
from .mixture import SpreadRepeats
from .partial_local import PartialLocalPlan
from .sliding_window import SlidingWindowPlan
from .stratified import StratifiedPlan
from .torn import TornLast
from .units import check_params

STRATEGIES: dict[str, type[Plan]] = {
    p.name: p
    for p in (
        NoShufflePlan, ShuffleOncePlan, FullShufflePlan, PageShufflePlan,
        BlockOnlyPlan, CorgiPilePlan, StratifiedPlan, SlidingWindowPlan, PartialLocalPlan,
    )
}

STRATEGY_HELP: dict[str, str] = {name: cls.help for name, cls in STRATEGIES.items()}
"""One line per strategy for ``--help`` and the docs (each class's ``help``)."""


def check_spec(spec: ShuffleSpec) -> None:
    """Raise ValueError for an unknown strategy or a parameter out of range."""
    if spec.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {spec.strategy!r}; valid: {', '.join(STRATEGIES)}")
    check_params(spec)
    if spec.balance and spec.strategy != "full":
        raise ValueError(f"balance assigns single records to ranks: it needs strategy full, not {spec.strategy!r}")


def make_plan(index: RecordIndex, spec: ShuffleSpec, epoch: int, rank: int = 0, world: int = 1,
              part: int = 0, parts: int = 1, costs: np.ndarray | None = None) -> Plan:
    """The output order of one file for (spec, epoch) as seen by ``rank`` of ``world``; with
    ``parts`` > 1, the ``part``-th of that rank's share split again (for its loader processes).

    The parts of a rank, in part order, are its stream: the same records, exactly once each
    (after ``spec.even``'s padding or dropping, which works on the rank's whole stream).  An
    index's torn records (lines without their newline) are planned apart and given last, at the
    end of the last rank's last part (`torn.TornLast`).
    ``costs``: per-record costs for ``spec.balance`` (default: byte lengths)."""
    check_spec(spec)
    torn = getattr(index, "torn", 0)  # lines without their newline: kept out, then given last
    if torn != len(getattr(index, "unterminated_ids", ())):
        raise ValueError("an index whose unterminated records are not its last ids: plan its torn_last()")
    body = index.body() if torn else index
    if spec.balance:
        if spec.balance_field is not None and costs is None:
            raise ValueError(f"balance by field {spec.balance_field!r} needs the records' costs")
        plan: Plan = BalancedPlan(body, spec, epoch, rank, world, part, parts,
                                  costs=costs[: body.n] if costs is not None and torn else costs)
    elif costs is not None:
        raise ValueError("costs are only used with balance")
    else:
        plan = STRATEGIES[spec.strategy](body, spec, epoch, rank, world, part, parts)
        if getattr(body, "repeated", None) is not None:  # a mixture's epoch that takes records twice
            plan = SpreadRepeats(plan)
    if torn:
        plan = TornLast(plan, index)
    if spec.even != "none" and world > 1 and not spec.balance:
        plan = EvenPlan(plan)
    return plan


__all__ = ["EVEN_MODES", "LOCAL_MODES", "Plan", "ShuffleSpec", "rng", "STRATEGIES", "STRATEGY_HELP", "check_spec", "make_plan"]
