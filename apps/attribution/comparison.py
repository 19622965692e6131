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
    def of(cls, *, table_id: int | None, valid_from: datetime | None, cost_model: CostModel) -> Comparison:
        return cls(table_id=table_id, valid_from=valid_from, weights=Weights.from_cost_model(cost_model),
                   tiered=cost_model.kind == CostModel.Kind.TIERED_PER_CALL)

    def needs(self, table_id: int | None) -> bool:
        """Whether usage recorded under table_id must be re-priced for this comparison."""
        return not self.tiered and self.table_id is not None and table_id is not None and table_id != self.table_id


def repricing(row: Mapping, comparison: Comparison, prices: Mapping[tuple[int, int | None], Prices]) -> Decimal:
    """What moving one rollup row's usage from its table to the comparison's adds to its billed cost (USD).

    row: table_id, gpu_sku_id, vcpus, memory_gb and the usage sums gpu_seconds, wall_s, energy_j.
    """
    if not comparison.needs(row["table_id"]):
        return Decimal(0)
    usage = {"device_seconds": float(row["gpu_seconds"]), "wall_s": float(row["wall_s"]),
             "energy_j": float(row["energy_j"]), "vcpus": float(row["vcpus"] or 0),
             "memory_gb": float(row["memory_gb"] or 0)}
    sku = row["gpu_sku_id"]
    target, billed = prices.get((comparison.table_id, sku)), prices.get((row["table_id"], sku))
    if target is None or billed is None:  # a table deleted meanwhile: compared as billed
        return Decimal(0)
    at_window = rollup_cost(prices=target, weights=comparison.weights, **usage)
    as_billed = rollup_cost(prices=billed, weights=comparison.weights, **usage)
    return Decimal(repr(at_window - as_billed)).quantize(MICRO)


def prices_needed(rows: Iterable[Mapping], comparisons: Mapping) -> tuple[set[int], set[int | None]]:
    """The (tables, SKUs) whose prices the re-pricing of these rows reads; empty when nothing moves.

    comparisons: keyed by each row's `key` (arm or experiment).
    """
    tables, skus = set(), set()
    for row in rows:
        comparison = comparisons[row["key"]]
        if comparison.needs(row["table_id"]):
            tables |= {row["table_id"], comparison.table_id}
            skus.add(row["gpu_sku_id"])
    return tables, skus
