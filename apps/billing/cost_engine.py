"""Cost engine: how telemetry becomes money. Pure functions, no ORM, no Django.

A run's bill (intervals split exactly at price boundaries, attempts, modelled energy) is
apps.billing.bill's, which prices with resource_weighted_cost and tiered_cost from here. Runs and
strategy-search probes alike are billed by apps.billing.bill (apps.billing.services). The prices
themselves (Prices, FREE) are pricing's: apps.pricing.prices. The tests' independent hand
calculation (each interval at the table in force when it closed) lives with the tests:
tests/pricing_reference.py.

Conventions (the why behind the numbers):
- Quantities and money are floats; rounding happens only where results are stored.
- A telemetry sample closes the interval since the previous sample of the same run; the
  interval is priced with the prices in force when that closing sample was taken.
- The first sample of a run (``prev=None``) has no interval: dt = 0, so nothing
  time-based is billed for it, but its cumulative counters (energy, tokens, step) are
  counted from zero, because they accumulated since the run started.
- Counters never run backwards in a bill: a negative delta (counter reset, sample out of
  order) is clamped to 0. Clamping can under-bill the stretch around a reset; it can never
  bill anything twice or produce a negative cost.
- ``util_pct=None`` means "unknown", and unknown is counted as busy, so idle cost (the
  figure people act on) is never overstated.
- ``energy_j`` and ``power_w`` describe the whole run (all its devices), not one device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from apps.pricing.prices import Prices, reject_negative_fields

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3_600_000.0


def _add(a: Any, b: Any) -> Any:
    """Field-wise sum of two dataclass instances of the same type."""
    return type(a)(*(getattr(a, f.name) + getattr(b, f.name) for f in fields(a)))


def _sub(a: Any, b: Any) -> Any:
    """Field-wise difference (a re-priced interval leaves the bill: the old figures come off)."""
    return type(a)(*(getattr(a, f.name) - getattr(b, f.name) for f in fields(a)))


@dataclass(frozen=True)
class Weights:
    """Multipliers of the resource_weighted cost model, one per resource term."""

    gpu: float = 1.0
    energy: float = 1.0
    cpu: float = 1.0
    memory: float = 1.0

    def __post_init__(self) -> None:
        reject_negative_fields(self)

    @classmethod
    def from_cost_model(cls, cost_model: Any) -> Weights:
        """Build from a CostModel-like object (duck-typed, Decimals become floats)."""
        return cls(
            gpu=float(cost_model.gpu_weight),
            energy=float(cost_model.energy_weight),
            cpu=float(cost_model.cpu_weight),
            memory=float(cost_model.memory_weight),
        )


@dataclass(frozen=True)
class Usage:
    """Resources consumed over a window of a run; windows that do not overlap add up."""

    wall_s: float = 0.0
    device_seconds: float = 0.0
    busy_device_seconds: float = 0.0
    energy_j: float = 0.0
    vcpu_seconds: float = 0.0
    memory_gb_seconds: float = 0.0
    tokens: int = 0
    steps: int = 0

    def __add__(self, other: Usage) -> Usage:
        return _add(self, other)

    def __sub__(self, other: Usage) -> Usage:
        return _sub(self, other)

    @classmethod
    def zero(cls) -> Usage:
        return cls()


@dataclass(frozen=True)
class CostBreakdown:
    """Cost of a window by resource, with the device cost split into used and idle."""

    gpu_usd: float = 0.0
    energy_usd: float = 0.0
    cpu_usd: float = 0.0
    memory_usd: float = 0.0
    used_usd: float = 0.0
    idle_usd: float = 0.0
    total_usd: float = 0.0
    energy_kwh: float = 0.0
    gpu_hours: float = 0.0
    carbon_g: float = 0.0  # gCO2e: energy x PUE x the grid's intensity (not money: not in total)

    def __add__(self, other: CostBreakdown) -> CostBreakdown:
        return _add(self, other)

    def __sub__(self, other: CostBreakdown) -> CostBreakdown:
        return _sub(self, other)

    @classmethod
    def zero(cls) -> CostBreakdown:
        return cls()


@dataclass(frozen=True)
class Projection:
    """A run extrapolated to target_steps: the comparison table's columns. Never measured."""

    target_steps: int
    gpu_hours: float
    electricity_usd: float
    total_usd: float
    completion_s: float
    estimated: bool = True


def _seconds(ts: Any) -> float:
    """A timestamp as float seconds; datetimes of one run are all aware or all naive."""
    return ts.timestamp() if isinstance(ts, datetime) else float(ts)


def resource_weighted_cost(
    usage: Usage, prices: Prices, weights: Weights = Weights()
) -> CostBreakdown:  # noqa: B008
    """Price a usage window with the resource_weighted model (GPU, energy x PUE, vCPU, memory)."""
    gpu_hours = usage.device_seconds / SECONDS_PER_HOUR
    energy_kwh = usage.energy_j / JOULES_PER_KWH
    gpu_usd = gpu_hours * prices.gpu_hour_usd * weights.gpu
    energy_usd = energy_kwh * prices.pue * prices.electricity_usd_per_kwh * weights.energy
    cpu_usd = usage.vcpu_seconds / SECONDS_PER_HOUR * prices.vcpu_hour_usd * weights.cpu
    memory_usd = (
        usage.memory_gb_seconds / SECONDS_PER_HOUR * prices.memory_gb_hour_usd * weights.memory
    )
    total = gpu_usd + energy_usd + cpu_usd + memory_usd
    busy_share = (
        0.0
        if usage.device_seconds <= 0
        else min(1.0, usage.busy_device_seconds / usage.device_seconds)
    )
    # As OpenCost reports it: a reserved device is paid whether busy or not, so its idle share
    # is cost too; energy, CPU and memory are only what was drawn, so they count as used.
    idle = gpu_usd * (1.0 - busy_share)
    return CostBreakdown(
        gpu_usd=gpu_usd,
        energy_usd=energy_usd,
        cpu_usd=cpu_usd,
        memory_usd=memory_usd,
        used_usd=total - idle,
        idle_usd=idle,
        total_usd=total,
        energy_kwh=energy_kwh,
        gpu_hours=gpu_hours,
        carbon_g=energy_kwh * prices.pue * prices.carbon_g_per_kwh,
    )


def _parse_tiers(tiers: Iterable[Mapping[str, Any]]) -> list[tuple[float | None, float]]:
    """Tiers as (upper bound or None, price) pairs, checked the way validate_tiers checks them."""
    parsed: list[tuple[float | None, float]] = []
    previous = 0.0
    tiers = list(tiers)
    if not tiers:
        raise ValueError("tiered pricing needs at least one tier")
    for i, tier in enumerate(tiers):
        price = float(tier["usd_per_unit"])
        if not math.isfinite(price) or price < 0:
            raise ValueError(f"tier {i}: usd_per_unit must be a finite number >= 0")
        up_to = tier["up_to"]
        if up_to is None:
            if i != len(tiers) - 1:
                raise ValueError(f"tier {i}: only the last tier may be open (up_to None)")
            parsed.append((None, price))
            continue
        if float(up_to) <= previous:
            raise ValueError(f"tier {i}: up_to must be above {previous:g}")
        previous = float(up_to)
        parsed.append((previous, price))
    return parsed


def tiered_cost(units_before: float, units: float, tiers: Sequence[Mapping[str, Any]]) -> float:
    """Price `units` that follow `units_before` already-billed units,
    walking volume tiers marginally."""
    if units_before < 0 or units < 0:
        raise ValueError("units_before and units must be >= 0")
    parsed = _parse_tiers(tiers)
    start, end = float(units_before), float(units_before) + float(units)
    cost, lower = 0.0, 0.0
    for i, (up_to, price) in enumerate(parsed):
        # A closed last tier keeps its price beyond its bound: refusing to bill would lose money
        # in the middle of a run, and validate_tiers accepts a closed last tier.
        upper = math.inf if up_to is None or i == len(parsed) - 1 else up_to
        overlap = min(end, upper) - max(start, lower)
        if overlap > 0:
            cost += overlap * price
        if end <= upper:
            break
        lower = upper
    return cost


def cost_per_million_tokens(total_usd: float, tokens: int) -> float | None:
    """USD per 1M tokens, or None when no token was processed."""
    if tokens <= 0:
        return None
    return total_usd / tokens * 1_000_000


def project(
    usage: Usage,
    cost: CostBreakdown,
    *,
    target_steps: int,
    tiers: Sequence[Mapping[str, Any]] | None = None,
    unit: str = "token",
) -> Projection | None:
    """One run extrapolated per step to target_steps (None before the first step); an estimate.

    Resource terms scale linearly. Under a tiered model the run's units (steps, or tokens at
    the measured tokens per step) are priced through the tiers from zero: the 1000th step of
    a run is billed at the tier it falls in, not at the average price of the first hundred.
    """
    if target_steps <= 0:
        raise ValueError("target_steps must be > 0")
    if usage.steps <= 0:
        return None
    scale = target_steps / usage.steps
    total = cost.total_usd * scale
    if tiers:
        units = target_steps if unit == "step" else usage.tokens * scale
        total = tiered_cost(0, units, tiers)
    # electricity_usd is the energy term as billed (PUE and the cost model's weight included).
    return Projection(
        target_steps=target_steps,
        gpu_hours=cost.gpu_hours * scale,
        electricity_usd=cost.energy_usd * scale,
        total_usd=total,
        completion_s=usage.wall_s * scale,
    )
