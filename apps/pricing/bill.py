"""A run's bill as a pure function of its samples and the price schedule. No ORM, no Django.

This is the reference the set-based SQL of apps.telemetry.rollup matches (tests hold them
to the same figures). The rules, in the README's "External runs and billing rules":
- Samples are taken in seq order; each one closes the interval since the sample before it,
  when that sample belongs to the same attempt. An attempt's first sample has no interval
  (billed time starts at it), but its cumulative counters (energy, tokens, step) count from 0.
- An interval's time is split exactly at the price schedule's boundaries (``valid_from``):
  each part is priced with the table in force over it. Its energy is split in proportion
  to time; its tokens and steps fall where the closing sample was taken.
- The interval takes the closing sample's utilisation (NVML's is an average over the period
  just before the reading). Unknown utilisation counts as busy.
- Energy: the counter's growth where both ends have it, else the mean of the known power
  readings x dt, else (a GPU run that reports neither) the SKU's board power x GPUs x
  utilisation x dt, flagged estimated, else 0. Counters never run backwards in a bill.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.pricing.cost_engine import (
    CostBreakdown,
    Prices,
    Usage,
    Weights,
    _field,
    _seconds,
    resource_weighted_cost,
)

# Before a tenant's first pricing table there is no price: such time costs nothing.
FREE = Prices(gpu_hour_usd=0, electricity_usd_per_kwh=0, pue=1, vcpu_hour_usd=0, memory_gb_hour_usd=0)


@dataclass
class Bill:
    """Usage and cost of a run, by price period (-1: before the first table) and in total."""

    periods: dict[int, Usage] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    cost: CostBreakdown = field(default_factory=CostBreakdown)
    max_step: int = 0
    energy_estimated: bool = False


def busy_share(util: Any) -> float:
    return 1.0 if util is None else min(1.0, max(0.0, float(util) / 100.0))


def run_bill(
    samples: Iterable[Any],
    *,
    starts: Sequence[datetime | float],
    prices: Sequence[Prices],
    weights: Weights = Weights(),  # noqa: B008
    gpu_count: float = 1,
    vcpus: float = 0,
    memory_gb: float = 0.0,
    modelled_power_w: float = 0.0,
) -> Bill:
    """Bill the stored samples of one run (any order; one sample per seq) under a price schedule.

    `starts[i]` is when `prices[i]` comes into force; `modelled_power_w`: board power of all
    the run's GPUs, used for intervals that report neither energy nor power (0: none).
    """
    rows = sorted({_field(s, "seq"): s for s in samples}.values(), key=lambda s: _field(s, "seq"))
    edges = [_seconds(s) for s in starts]
    sums: dict[int, list[float]] = {}
    bill = Bill()

    def add(period: int, share: float, dt: float, busy: float, energy: float, tokens: int = 0,
            steps: int = 0) -> None:
        acc = sums.setdefault(period, [0.0] * 5 + [0, 0])
        acc[0] += share * dt
        acc[1] += share * dt * busy
        acc[2] += share * energy
        acc[5] += tokens
        acc[6] += steps

    prev = None
    for cur in rows:
        linked = prev is not None and _field(prev, "attempt") == _field(cur, "attempt")
        t1 = _seconds(_field(cur, "ts"))
        own = bisect.bisect_right(edges, t1) - 1
        step, tokens = int(_field(cur, "step") or 0), int(_field(cur, "tokens") or 0)
        bill.max_step = max(bill.max_step, step)
        bill.energy_estimated |= bool(_field(cur, "estimated"))
        energy_now = _field(cur, "energy_j")
        if not linked:
            add(own, 1.0, 0.0, 0.0, max(0.0, float(energy_now or 0)), tokens, step)
            prev = cur
            continue
        t0 = _seconds(_field(prev, "ts"))
        dt = max(0.0, t1 - t0)
        busy = busy_share(_field(cur, "util_pct"))
        energy_before = _field(prev, "energy_j")
        powers = [float(p) for p in (_field(prev, "power_w"), _field(cur, "power_w")) if p is not None]
        if energy_now is not None and energy_before is not None:
            energy = max(0.0, float(energy_now) - float(energy_before))
        elif powers:
            energy = max(0.0, sum(powers) / len(powers)) * dt
        elif modelled_power_w > 0 and dt > 0:
            energy = modelled_power_w * busy * dt
            bill.energy_estimated = True
        else:
            energy = 0.0
        steps = max(0, step - int(_field(prev, "step") or 0))
        tokens_d = max(0, tokens - int(_field(prev, "tokens") or 0))
        add(own, 0.0, 0.0, 0.0, 0.0, tokens_d, steps)
        if dt <= 0:
            add(own, 1.0, 0.0, busy, energy)
        else:
            for period in range(bisect.bisect_right(edges, t0) - 1, own + 1):
                lo = edges[period] if period >= 0 else -float("inf")
                hi = edges[period + 1] if period + 1 < len(edges) else float("inf")
                overlap = min(t1, hi) - max(t0, lo)
                if overlap > 0:
                    add(period, overlap / dt, dt, busy, energy)
        prev = cur

    for period, (wall, busy_s, energy, _, _, tokens, steps) in sorted(sums.items()):
        usage = Usage(wall_s=wall, device_seconds=wall * gpu_count, busy_device_seconds=busy_s * gpu_count,
                      energy_j=energy, vcpu_seconds=wall * vcpus, memory_gb_seconds=wall * memory_gb,
                      tokens=int(tokens), steps=int(steps))
        bill.periods[period] = usage
        bill.usage = bill.usage + usage
        bill.cost = bill.cost + resource_weighted_cost(usage, prices[period] if period >= 0 else FREE, weights)
    return bill
