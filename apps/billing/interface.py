"""Billing's one door: the only module of apps.billing that other apps and the workers import.

The rest of the app is private to it (an import-linter contract in pyproject.toml says so). Where
each of these lives, and the bill's rules (bill.py, cost_engine.py): apps/billing/README.md.
"""

from apps.billing.bill import (
    breakdown_shown,
    carbon_figure,
    carbon_method,
    carbon_shown,
    carbon_unmeasured,
    rollup_cost,
)
from apps.billing.cost_engine import (
    JOULES_PER_KWH,
    SECONDS_PER_HOUR,
    CostBreakdown,
    Projection,
    Usage,
    Weights,
    cost_per_million_tokens,
    project,
)
from apps.billing.focus_export import COLUMNS as FOCUS_COLUMNS
from apps.billing.focus_export import focus_csv, month_bounds
from apps.billing.reconcile import Reconciliation, reconciliation, reconciliation_csv
from apps.billing.services import (
    IngestResult,
    budget_enforce,
    run_external_ingest,
    run_reprice,
    run_totals_recompute,
    samples_bill,
    telemetry_ingest,
)

__all__ = [
    # ingest: a batch of a run's samples stored once per (run, seq), the run's totals moved
    "IngestResult",
    "run_external_ingest",
    "telemetry_ingest",
    # a run's bill closed (recomputed) from every stored sample, at a price table or the schedule's
    "run_totals_recompute",
    # a finished run re-priced at another table, audited
    "run_reprice",
    # the bill of samples that belong to no run: a strategy-search probe's timed stretch
    "samples_bill",
    # the month's spend against the tenant's budget (a step is recorded and alerted by apps.alerts)
    "budget_enforce",
    # the tenant's allocation of a month as FOCUS 1.2 rows (CSV, streamed): a run's bill per day
    "FOCUS_COLUMNS",
    "focus_csv",
    "month_bounds",
    # a month of the tenant's bill against a FOCUS import of the cloud's invoice, per resource and
    # UTC day: attributed, idle, unmatched and the difference for the same hours (CSV: every row)
    "Reconciliation",
    "reconciliation",
    "reconciliation_csv",
    # The bill's rules that other apps read (bill.py, cost_engine.py; pure, no ORM). Only these:
    # the run's bill itself is computed here, never elsewhere. The prices they apply (Prices,
    # FREE) are pricing's, apps.pricing.prices.
    # - a bill as the API, the pages and the report show it: unpriced components None, never $0;
    #   gCO2e with its method and band, or unpriced, or unmeasured
    "breakdown_shown",
    "carbon_shown",
    "carbon_figure",
    "carbon_method",
    "carbon_unmeasured",
    # - the cost formula and its values: attribution prices an arm's rolled-up usage with it
    #   (rollup_cost: linear, so SQL can multiply), the report projects a run to the target steps
    "Usage",
    "CostBreakdown",
    "Weights",
    "rollup_cost",
    "Projection",
    "project",
    "cost_per_million_tokens",
    # - the units the formula converts with (attribution's stored sums are in J and s)
    "JOULES_PER_KWH",
    "SECONDS_PER_HOUR",
]
