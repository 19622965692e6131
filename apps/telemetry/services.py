"""Telemetry lands here: stored once per (run, seq), and the run's totals move forward."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction

from apps.experiments.models import Run
from apps.pricing import cost_engine
from apps.pricing.models import CostModel
from apps.pricing.selectors import prices_lookup
from apps.telemetry.ingest import samples_insert, samples_validate
from apps.telemetry.models import TelemetrySample

PRICED_FIELDS = ("seq", "ts", "attempt", "step", "energy_j", "power_w", "tokens", "util_pct", "estimated")


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int
    duplicates: int


@transaction.atomic
def telemetry_ingest(*, run_id: int, samples: list, attempt: int | None = None) -> IngestResult:
    """Validate and store a batch for a run; idempotent by (run, seq). Nothing partial on error."""
    run = Run.objects.select_for_update().get(pk=run_id)
    parsed = samples_validate(samples)
    inserted = samples_insert(run_id=run.pk, attempt=attempt or max(run.attempts, 1), samples=parsed)
    if inserted:
        run_totals_advance(run=run)
    return IngestResult(received=len(samples), inserted=inserted, duplicates=len(samples) - inserted)


def run_totals_advance(*, run: Run, final: bool = False) -> None:
    """Price the samples after the run's watermark and add them to its totals.

    Only the gap-free prefix is priced while the run is live, so a sample arriving late
    still lands in its own interval; `final` prices across gaps (the counters are
    cumulative, so a missing sample only merges two intervals). Caller holds the row lock.
    """
    rows = list(
        TelemetrySample.objects.filter(run_id=run.pk, seq__gte=run.priced_seq)
        .order_by("seq")
        .values(*PRICED_FIELDS)
    )
    if rows and rows[-1]["seq"] > run.last_seq:
        run.last_seq = rows[-1]["seq"]
        run.save(update_fields=["last_seq", "updated_at"])
    previous = rows[0] if rows and rows[0]["seq"] == run.priced_seq else None
    fresh = rows[1:] if previous else rows
    if not final:
        expected = run.priced_seq + 1
        prefix = []
        for row in fresh:
            if row["seq"] != expected:
                break
            prefix.append(row)
            expected += 1
        fresh = prefix
    if not fresh:
        return

    cost_model = run.experiment.cost_model
    prices_at = prices_lookup(
        tenant_id=run.tenant_id, gpu_sku_id=run.gpu_sku_id, pinned_table_id=run.experiment.pricing_table_id
    )
    weights = cost_engine.Weights.from_cost_model(cost_model)
    usage, cost = cost_engine.Usage.zero(), cost_engine.CostBreakdown.zero()
    # Counters restart with each worker attempt: an attempt's first sample starts afresh.
    for attempt, group in itertools.groupby(fresh, key=lambda r: r["attempt"]):
        group = list(group)
        prev = previous if previous and previous["attempt"] == attempt else None
        u, c = cost_engine.price_samples(
            group, prices_at=prices_at, weights=weights, gpu_count=run.gpu_count, vcpus=run.vcpus,
            memory_gb=run.memory_gb, previous=prev,
        )
        usage, cost = usage + u, cost + c
        previous = group[-1]

    breakdown = dict(run.cost_breakdown or {})
    for key, value in dataclasses.asdict(cost).items():
        breakdown[key] = breakdown.get(key, 0.0) + value
    if cost_model.kind == CostModel.Kind.TIERED_PER_CALL:
        units_before = breakdown.get("units", 0)
        units = usage.steps if cost_model.unit == CostModel.Unit.STEP else usage.tokens
        breakdown["units"] = units_before + units
        breakdown["tiered_usd"] = breakdown.get("tiered_usd", 0.0) + cost_engine.tiered_cost(
            units_before, units, cost_model.tiers
        )
        total = breakdown["tiered_usd"]
    else:
        total = breakdown["total_usd"]

    run.priced_seq = fresh[-1]["seq"]
    run.steps = max(run.steps, max(r["step"] for r in fresh))
    run.tokens += usage.tokens
    run.device_seconds += usage.device_seconds if run.gpu_count else usage.wall_s
    run.energy_j += usage.energy_j
    run.energy_estimated = run.energy_estimated or any(r["estimated"] for r in fresh)
    run.cost_breakdown = breakdown
    run.cost_usd = Decimal(str(round(total, 6)))
    run.save(update_fields=[
        "priced_seq", "steps", "tokens", "device_seconds", "energy_j", "energy_estimated",
        "cost_breakdown", "cost_usd", "updated_at",
    ])
