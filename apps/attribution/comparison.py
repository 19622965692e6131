"""Arms are compared on usage priced at one table, never on bills priced at different ones.

A run's bill follows the tables in force while it ran, so two identical runs either side of a
price edit cost differently, and the arm that ran first would look cheaper. Each attribution
window records the table its comparison used (the experiment's pinned table, else the one in
force at the window's end); a window's comparison takes every observation's billed cost and
re-prices the usage of observations recorded under another table at its own:

    compared = billed + sum over earlier tables T of (usage under T at the window's table - at T)

Usage (device-seconds, wall seconds, energy) is already rolled up per run and window, so this
is arithmetic over the rollup with apps.pricing.bill's formula, never a re-read of samples.
Under one table throughout the correction is exactly 0 and the comparison is the bill. The
usage of an observation is priced as a whole at its window's table (the one in force at its
end): the part of the one window that straddles an edit stays at the older price.
Tiered models price units of work, which no table changes: their comparison is the bill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from apps.pricing.bill import rollup_cost
from apps.pricing.cost_engine import Prices, Weights
from apps.pricing.models import CostModel

MICRO = Decimal("0.000001")


@dataclass(frozen=True)
class Comparison:
    """The one table an experiment's arms are compared at, and the cost model's weights."""

    table_id: int | None
    valid_from: datetime | None
    weights: Weights
    tiered: bool

    @classmethod
    def of(
        cls, *, table_id: int | None, valid_from: datetime | None, cost_model: CostModel
    ) -> Comparison:
        return cls(
            table_id=table_id,
            valid_from=valid_from,
            weights=Weights.from_cost_model(cost_model),
            tiered=cost_model.kind == CostModel.Kind.TIERED_PER_CALL,
        )

    def needs(self, table_id: int | None) -> bool:
        """Whether usage recorded under table_id must be re-priced for this comparison."""
        return (
            not self.tiered
            and self.table_id is not None
            and table_id is not None
            and table_id != self.table_id
        )


@dataclass(frozen=True)
class PriceDelta:
    """What moving one unit of rolled-up usage from a run's table to the comparison's adds (USD).

    The resource-weighted cost is linear in usage, so apps.pricing.bill's formula evaluated at one
    unit of each resource gives it; the database multiplies (apps.attribution.selectors).
    """

    gpu_second: Decimal
    joule: Decimal
    vcpu_second: Decimal  # per wall second and vCPU
    gb_second: Decimal  # per wall second and GB of memory

    @classmethod
    def between(cls, *, target: Prices, billed: Prices, weights: Weights) -> PriceDelta:
        units = (
            {"device_seconds": 1.0},
            {"energy_j": 1.0},
            {"wall_s": 1.0, "vcpus": 1.0},
            {"wall_s": 1.0, "memory_gb": 1.0},
        )
        zero = {
            "device_seconds": 0.0,
            "wall_s": 0.0,
            "energy_j": 0.0,
            "vcpus": 0.0,
            "memory_gb": 0.0,
        }
        return cls(
            *(
                Decimal(
                    repr(
                        rollup_cost(prices=target, weights=weights, **{**zero, **u})
                        - rollup_cost(prices=billed, weights=weights, **{**zero, **u})
                    )
                )
                for u in units
            )
        )

    def times(self, *, gpu_seconds, energy_j, wall_s, vcpus, memory_gb) -> Decimal:
        """USD this delta adds to rolled-up usage (what the database computes, here for one row)."""
        return (
            self.gpu_second * gpu_seconds
            + self.joule * energy_j
            + wall_s * (self.vcpu_second * vcpus + self.gb_second * Decimal(repr(float(memory_gb))))
        )


def price_deltas(
    moves: Iterable[tuple[int, Comparison, int]], prices: Mapping[tuple[int, int | None], Prices]
) -> dict[tuple[int, int, int | None], PriceDelta]:
    """Per (key, billed table, SKU): the PriceDelta to the key's comparison table,
    for every SKU priced.

    moves: (key, comparison, billed table) with comparison.needs(billed table);
    key an experiment or arm.
    """
    skus = {sku for _, sku in prices}
    return {
        (key, billed, sku): PriceDelta.between(
            target=prices[(c.table_id, sku)], billed=prices[(billed, sku)], weights=c.weights
        )
        for key, c, billed in moves
        for sku in skus
        if (c.table_id, sku) in prices and (billed, sku) in prices
    }
