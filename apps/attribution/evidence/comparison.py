"""Arms are compared on usage priced at one table, never on bills priced at different ones.

A run's bill follows the tables in force while it ran, so two identical runs either side of a
price edit cost differently, and the arm that ran first would look cheaper. Each attribution
window records the table its comparison uses (the experiment's pinned table, else the one in
force at the window's end). Where every second of the experiment's runs was billed at that
table, the comparison is the bill. Where another version could have billed some of it (a
version in force during its runs, a window recorded at another table, a run re-priced by hand:
apps.attribution.selectors.experiments_priced_from_usage), every arm's compared cost is its
rolled-up usage priced at the one table:

    compared = sum over observations of usage (device-seconds, energy, vCPU and memory seconds)
               x the one table's unit prices

never the bill plus a per-window delta (a window's bill can span several versions: the audit saw
+14.7 % and -37.4 % between identical arms). The cost is linear in usage, so the unit prices come
from the bill's formula (apps.billing.bill) at one unit of each resource and the database
multiplies.
Tiered models price units of work, which no table changes: their comparison is the bill.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from apps.billing.interface import Weights, rollup_cost
from apps.pricing.models import CostModel
from apps.pricing.prices import Prices

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

    @property
    def needs_usage_pricing(self) -> bool:
        """Whether usage can be priced at one table here (not a tiered model, a table named)."""
        return not self.tiered and self.table_id is not None


@dataclass(frozen=True)
class PriceDelta:
    """The USD difference one unit of each rolled-up resource makes between two price sets (from
    the free one: the unit prices of a table, apps.attribution.evidence.moments.unit_prices).

    The resource-weighted cost is linear in usage, so the bill's formula (apps.billing.bill)
    evaluated at one unit of each resource gives it; the database multiplies
    (apps.attribution.evidence.moments).
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
