"""The Pareto frontier of a sweep's probes, with a tie tolerance. Pure, no Django.

All objectives are minimised. Two measurements closer than the tolerance are a tie, not a win:
``a`` dominates ``b`` when ``a`` is no worse than ``b`` on every objective (within the tolerance)
and clearly better on at least one (by more than the tolerance). The tolerance of a pair is

    tol(a, b) = max(base, spread(a) + spread(b))

``base`` is the sweep's ``tie_tolerance`` (default 0.02 = 2 %); ``spread`` is a probe's own
relative measurement spread (coefficient of variation of its timed steps' step time), so two
noisy probes need a larger gap before one knocks the other off the frontier. Consequences:
duplicates and near-ties are all kept; infeasible points and points missing an objective are
never on the frontier and never dominate anything.

A tolerance must not lose the ends of the frontier: the best point on each objective (the cheapest,
the fastest; an exact tie there decided by the other objectives) is always kept, even when a
near-tie that is clearly better elsewhere "dominates" it. Otherwise the cheapest probe a sweep
measured could be missing from its frontier.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    key: Hashable
    values: Sequence[float | None]  # one per objective, all minimised
    spread: float = 0.0  # relative measurement spread (e.g. 0.03 = 3 %)
    feasible: bool = True

    @property
    def comparable(self) -> bool:
        return self.feasible and all(v is not None for v in self.values)


def pair_tolerance(a: Point, b: Point, base: float) -> float:
    return max(base, a.spread + b.spread)


def dominates(a: Point, b: Point, *, base: float = 0.02) -> bool:
    """True when a is no worse than b on every objective and clearly better on one
    (see module doc)."""
    if not (a.comparable and b.comparable):
        return False
    if len(a.values) != len(b.values):
        raise ValueError("points measured on different objectives")
    tol = pair_tolerance(a, b, base)
    clearly_better = False
    for x, y in zip(a.values, b.values, strict=True):
        scale = max(abs(x), abs(y))
        if x - y > tol * scale:  # worse by more than the tolerance
            return False
        if y - x > tol * scale:
            clearly_better = True
    return clearly_better


def pareto_front(points: Sequence[Point], *, base: float = 0.02) -> list[Hashable]:
    """Keys of the comparable points no other point dominates, in the given order."""
    candidates = [p for p in points if p.comparable]
    ends = (
        {
            id(min(candidates, key=lambda p, i=i: (p.values[i], *p.values)))
            for i in range(len(candidates[0].values))
        }
        if candidates
        else set()
    )
    return [
        p.key
        for p in candidates
        if id(p) in ends or not any(dominates(q, p, base=base) for q in candidates if q is not p)
    ]
