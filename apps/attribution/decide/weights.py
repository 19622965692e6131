"""Dynamic traffic weights: shift toward cheaper arms, within bounds. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping


def _normalized(values: Mapping[Hashable, float]) -> dict:
    total = sum(values.values())
    if total <= 0:
        return {k: 1.0 / len(values) for k in values}
    return {k: v / total for k, v in values.items()}


def _with_floor(raw: Mapping[Hashable, float], floor: float) -> dict:
    """Shares proportional to raw, none below floor
    (water-filling: floored arms are fixed, the rest rescaled)."""
    fixed: set = set()
    while True:
        free = [k for k in raw if k not in fixed]
        mass = 1.0 - floor * len(fixed)
        total = sum(raw[k] for k in free)
        out = {k: floor for k in fixed}
        out.update({k: (raw[k] / total * mass if total > 0 else mass / len(free)) for k in free})
        low = [k for k in free if out[k] < floor]
        if not low or len(low) == len(free):
            return out
        fixed.update(low)


def rebalance(
    shares: Mapping[Hashable, float],
    costs: Mapping[Hashable, float],
    *,
    tau: float,
    min_share: float,
    max_step: float,
) -> dict:
    """Next traffic shares (summing to 1) for arms with these current shares and costs per unit.

    Target: share proportional to exp(-(cost / cheapest - 1) / tau), so an arm tau more
    expensive than the cheapest gets 1/e of its traffic; no arm below min_share (an arm
    starved of traffic could never show it got cheaper). The move from the current shares
    to the target is scaled so no share changes by more than max_step in one cycle.
    """
    if set(shares) != set(costs):
        raise ValueError("shares and costs must name the same arms")
    if len(shares) < 2:
        return _normalized(shares) if shares else {}
    if tau <= 0 or max_step <= 0 or min_share < 0:
        raise ValueError("tau and max_step must be > 0, min_share >= 0")
    cheapest = min(costs.values())
    if cheapest <= 0:
        raise ValueError("costs must be > 0")
    floor = min(min_share, 1.0 / len(costs))
    raw = {k: math.exp(-(costs[k] / cheapest - 1.0) / tau) for k in costs}
    target = _with_floor(raw, floor)
    current = _normalized(shares)
    delta = {k: target[k] - current[k] for k in current}
    biggest = max(abs(d) for d in delta.values())
    if biggest == 0:
        return current
    # One common scale keeps the sum at 1 and the result between current and target.
    scale = min(1.0, max_step / biggest)
    return {k: current[k] + scale * delta[k] for k in current}
