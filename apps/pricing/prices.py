"""Prices as a bill reads them: the unit prices in force at one moment, and FREE (no table yet).

Pure, no ORM. Pricing builds them from its tables (selectors.price_schedule); billing prices usage
with them (apps.billing.bill, apps.billing.cost_engine), a floor above: pricing never imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


def reject_negative_fields(obj: Any) -> None:
    """Reject negative, NaN or infinite fields: they would make a cost negative or meaningless."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if not isinstance(value, int | float):
            continue
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{type(obj).__name__}.{f.name} must be a finite number >= 0, got {value!r}"
            )


@dataclass(frozen=True)
class Prices:
    """Unit prices in force at one moment (one pricing table and one GPU SKU's hourly rate)."""

    gpu_hour_usd: float
    electricity_usd_per_kwh: float
    pue: float
    vcpu_hour_usd: float
    memory_gb_hour_usd: float
    carbon_g_per_kwh: float = 0.0  # the grid's gCO2e per kWh (x PUE, like the electricity price)
    # Components that have no price here (their 0 above is not a price): "gpu" when the table
    # has no rate for the run's SKU; all of them before a tenant's first table.
    unpriced: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        reject_negative_fields(self)

    @classmethod
    def from_table(cls, table: Any, gpu_hour_usd: Any) -> Prices:
        """Build from a PricingTable-like object (duck-typed, Decimals become floats);
        gpu_hour_usd None: the table has no rate for the SKU (priced 0, marked unpriced)."""
        carbon = getattr(table, "carbon_g_per_kwh", None)
        unpriced = ({"gpu"} if gpu_hour_usd is None else set()) | (
            {"carbon"} if carbon is None else set()
        )
        return cls(
            unpriced=frozenset(unpriced),
            carbon_g_per_kwh=float(carbon or 0),
            gpu_hour_usd=float(gpu_hour_usd or 0),
            electricity_usd_per_kwh=float(table.electricity_usd_per_kwh),
            pue=float(table.pue),
            vcpu_hour_usd=float(table.vcpu_hour_usd),
            memory_gb_hour_usd=float(table.memory_gb_hour_usd),
        )


# Before a tenant's first pricing table there is no price: such time costs nothing, and every
# component of it is marked unpriced.
COMPONENTS = ("gpu", "energy", "vcpu", "memory", "carbon")
FREE = Prices(
    gpu_hour_usd=0,
    electricity_usd_per_kwh=0,
    pue=1,
    vcpu_hour_usd=0,
    memory_gb_hour_usd=0,
    unpriced=frozenset(COMPONENTS),
)
