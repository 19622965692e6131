"""Telemetry lands here: stored once per (run, seq), and the run's totals move forward."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.db.models import Max

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.pricing import cost_engine
from apps.pricing.models import CostModel
from apps.pricing.selectors import price_schedule
from apps.telemetry.ingest import samples_insert, samples_validate
from apps.telemetry.models import TelemetrySample
from apps.telemetry.rollup import contiguous_end, usage_rollup

# Samples stored beyond a gap before pricing stops waiting for it (about 2 minutes at 1 s).
GAP_PATIENCE_SAMPLES = 120


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int
    duplicates: int


@transaction.atomic
def telemetry_ingest(*, run_id: int, samples: list, attempt: int | None = None) -> IngestResult:
    """Validate and store a batch for a run; idempotent by (run, seq). Nothing partial on error."""
    run = Run.objects.select_for_update(of=("self",)).select_related("experiment__cost_model").get(pk=run_id)
    if run.kind == Run.Kind.WORKER and attempt is not None and (
        run.status != Run.Status.RUNNING or attempt != run.attempts
    ):
        # A worker whose lease was swept must not write into the attempt that replaced it, nor
        # into a run whose totals are final.
        raise ApplicationError(
            f"attempt: attempt {attempt} no longer holds run {run.pk} (now {run.status}, attempt {run.attempts})",
            {"fields": {"attempt": ["stale"]}}, code="stale_attempt", status=409,
        )
    parsed = samples_validate(samples)
    inserted = samples_insert(run_id=run.pk, attempt=attempt or max(run.attempts, 1), samples=parsed,
                              after_seq=run.last_seq)
    if inserted:
        run_totals_advance(run=run, landed=sorted(s["seq"] for s in parsed))
    return IngestResult(received=len(samples), inserted=inserted, duplicates=len(samples) - inserted)


def run_totals_advance(*, run: Run, final: bool = False, landed: list[int] | None = None) -> None:
    """Price the samples after the run's watermark and add them to its totals.

    Only the gap-free stretch is priced while the run is live, so a sample arriving late
    still lands in its own interval; `final` prices across gaps (the counters are
    cumulative, so a missing sample only merges two intervals). Caller holds the row lock.
    `landed`: the sorted seqs just stored, when known, which saves queries in the usual case.
    """
    previous_last = run.last_seq
    if landed:
        last = landed[-1]
    else:
        last = TelemetrySample.objects.filter(run_id=run.pk).aggregate(last=Max("seq"))["last"]
    last_moved = last is not None and last > run.last_seq
    if last_moved:
        run.last_seq = last
    if final:
        upto = run.last_seq
    elif landed and landed[0] == run.priced_seq + 1 and landed[-1] - landed[0] + 1 == len(landed) \
            and landed[-1] >= previous_last:
        upto = landed[-1]  # the batch continues the priced stretch, and nothing beyond it is stored
    else:
        upto = contiguous_end(run_id=run.pk, after_seq=run.priced_seq)
        if run.last_seq - (upto if upto is not None else run.priced_seq) > GAP_PATIENCE_SAMPLES:
            # A gap this far behind will not fill (a sample dropped for good): price across it,
            # or the run's cost would stand still until it ends. The counters are cumulative, so
            # the missing sample only merges two intervals.
            upto = run.last_seq
    if upto is None or upto <= run.priced_seq:
        if last_moved:
            run.save(update_fields=["last_seq", "updated_at"])
        return

    cost_model = run.experiment.cost_model
    schedule = price_schedule(
        tenant_id=run.tenant_id, gpu_sku_id=run.gpu_sku_id, pinned_table_id=run.experiment.pricing_table_id
    )
    weights = cost_engine.Weights.from_cost_model(cost_model)
    periods = usage_rollup(
        run_id=run.pk, after_seq=run.priced_seq, upto_seq=upto, gpu_count=run.gpu_count, vcpus=run.vcpus,
        memory_gb=run.memory_gb, boundaries=schedule.boundaries,
    )
    usage, cost = cost_engine.Usage.zero(), cost_engine.CostBreakdown.zero()
    for p in periods:
        usage = usage + p.usage
        cost = cost + cost_engine.resource_weighted_cost(p.usage, schedule.period_prices(p.period), weights)

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

    run.priced_seq = upto
    run.steps = max([run.steps, *(p.max_step for p in periods)])
    run.tokens += usage.tokens
    run.device_seconds += usage.device_seconds if run.gpu_count else usage.wall_s
    run.energy_j += usage.energy_j
    run.energy_estimated = run.energy_estimated or any(p.estimated for p in periods)
    run.cost_breakdown = breakdown
    run.cost_usd = Decimal(str(round(total, 6)))
    run.save(update_fields=[
        "priced_seq", "last_seq", "steps", "tokens", "device_seconds", "energy_j", "energy_estimated",
        "cost_breakdown", "cost_usd", "updated_at",
    ])
