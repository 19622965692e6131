"""The tests' independent hand calculation of a bill: each interval between two samples of a run
priced at the table in force when it closed, with costlab's cost rule (resource_weighted_cost).

Not costlab's bill (apps.billing.bill splits intervals exactly at price boundaries); kept apart
from it, and out of the production code, so that a test comparing the two compares two
calculations. A sample is a mapping or an object with the telemetry fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from apps.billing.cost_engine import (
    CostBreakdown,
    Usage,
    Weights,
    _seconds,
    resource_weighted_cost,
)
from apps.pricing.prices import Prices


def _field(sample: Any, name: str) -> Any:
    """Read a field from a mapping or an object (TelemetrySample rows and plain dicts both work)."""
    if isinstance(sample, Mapping):
        return sample.get(name)
    return getattr(sample, name, None)


def _delta(prev: Any, cur: Any) -> float:
    """Growth of a cumulative counter between two readings, never negative (reset or reorder)."""
    return max(0.0, float(cur or 0) - float(prev or 0))


def _interval_energy_j(prev: Any, cur: Any, dt: float) -> float:
    """Energy of one interval: the counter where both ends have it, else mean power x dt, else 0."""
    cur_e = _field(cur, "energy_j")
    if prev is None:
        # Run start: the counter accumulated from zero; there is no interval for power x dt.
        return max(0.0, float(cur_e)) if cur_e is not None else 0.0
    prev_e = _field(prev, "energy_j")
    if cur_e is not None and prev_e is not None:
        return _delta(prev_e, cur_e)
    powers = [float(p) for p in (_field(prev, "power_w"), _field(cur, "power_w")) if p is not None]
    if not powers:
        return 0.0
    return max(0.0, sum(powers) / len(powers)) * dt


def _interval(prev: Any, cur: Any, gpu_count: float, vcpus: float, memory_gb: float) -> tuple:
    """Usage of one interval as a tuple in Usage's field order (the hot loop avoids dataclasses)."""
    dt = (
        0.0
        if prev is None
        else max(0.0, _seconds(_field(cur, "ts")) - _seconds(_field(prev, "ts")))
    )
    device_s = dt * gpu_count
    util = _field(cur, "util_pct")
    # NVML utilisation is an average over the period just before the reading, i.e. this interval.
    busy_share = 1.0 if util is None else min(1.0, max(0.0, float(util) / 100.0))
    prev_tokens = 0 if prev is None else _field(prev, "tokens")
    prev_step = 0 if prev is None else _field(prev, "step")
    return (
        dt,
        device_s,
        device_s * busy_share,
        _interval_energy_j(prev, cur, dt),
        dt * vcpus,
        dt * memory_gb,
        max(0, int(_field(cur, "tokens") or 0) - int(prev_tokens or 0)),
        max(0, int(_field(cur, "step") or 0) - int(prev_step or 0)),
    )


def _resources(gpu_count: float, vcpus: float, memory_gb: float) -> tuple[float, float, float]:
    if gpu_count < 0 or vcpus < 0 or memory_gb < 0:
        raise ValueError("gpu_count, vcpus and memory_gb must be >= 0")
    return float(gpu_count), float(vcpus), float(memory_gb)  # Decimal-safe


def usage_between(
    prev: Any, cur: Any, *, gpu_count: int = 1, vcpus: float = 0, memory_gb: float = 0.0
) -> Usage:
    """Usage of the interval closed by `cur` (prev=None: the run's first sample, dt = 0)."""
    return Usage(*_interval(prev, cur, *_resources(gpu_count, vcpus, memory_gb)))


def price_samples(
    samples: Iterable[Any],
    *,
    prices_at: Callable[[Any], Prices],
    weights: Weights,
    gpu_count: int = 1,
    vcpus: float = 0,
    memory_gb: float = 0.0,
    previous: Any = None,
) -> tuple[Usage, CostBreakdown]:
    """Usage and cost of consecutive samples of one run (in seq order), after `previous` if given.

    Each interval is priced with the prices in force when it closed, so a pricing table that
    changes mid-run applies from the first sample taken under it, and incremental totals
    equal a full recompute. The cost is linear in usage under fixed prices, so intervals
    that share prices are summed first and priced once (same result, far fewer objects).
    """
    resources = _resources(gpu_count, vcpus, memory_gb)
    usage, cost = Usage.zero(), CostBreakdown.zero()
    group_prices: Prices | None = None
    sums = [0.0] * 8
    prev = previous

    def close_group() -> None:
        nonlocal usage, cost
        if group_prices is not None:
            window = Usage(*sums[:6], int(sums[6]), int(sums[7]))
            usage = usage + window
            cost = cost + resource_weighted_cost(window, group_prices, weights)

    for sample in samples:
        prices = prices_at(_field(sample, "ts"))
        if prices is not group_prices and prices != group_prices:
            close_group()
            group_prices, sums = prices, [0.0] * 8
        for i, value in enumerate(_interval(prev, sample, *resources)):
            sums[i] += value
        prev = sample
    close_group()
    return usage, cost
