"""Telemetry lands here: stored once per (run, seq), and the run's totals move forward."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import DataError, transaction
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.pricing import cost_engine
from apps.pricing.models import CostModel
from apps.pricing.selectors import price_schedule
from apps.telemetry.ingest import out_of_range, samples_insert, samples_validate
from apps.telemetry.rollup import SEQ_MAX, batch_ranges, usage_delta


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int
    duplicates: int


@transaction.atomic
def telemetry_ingest(*, run_id: int, samples: list, attempt: int | None = None) -> IngestResult:
    """Validate and store a batch for a run; idempotent by (run, seq). Nothing partial on error."""
    run = Run.objects.select_for_update(of=("self",)).select_related("experiment__cost_model", "gpu_sku").get(
        pk=run_id)
    if run.kind == Run.Kind.WORKER and attempt is not None and (
        run.status != Run.Status.RUNNING or attempt != run.attempts
    ):
        # A worker whose lease was swept must not write into the attempt that replaced it, nor
        # into a run whose totals are final.
        raise ApplicationError(
            f"attempt: attempt {attempt} no longer holds run {run.pk} (now {run.status}, attempt {run.attempts})",
            {"fields": {"attempt": ["stale"]}}, code="stale_attempt", status=409,
        )
    skew = timedelta(seconds=settings.COSTLAB_TELEMETRY_CLOCK_SKEW_S)
    parsed = samples_validate(samples, earliest=run.created_at - skew, latest=timezone.now() + skew)
    seqs = sorted(s["seq"] for s in parsed)
    if not seqs:
        return IngestResult(received=0, inserted=0, duplicates=0)
    appended = seqs[0] > run.last_seq
    # Before the insert: the stored rows around the batch bound what it can change.
    ranges = [(run.last_seq, SEQ_MAX)] if appended else batch_ranges(run_id=run.pk, seqs=seqs)
    try:
        fresh = samples_insert(run_id=run.pk, attempt=attempt or max(run.attempts, 1), samples=parsed,
                               after_seq=run.last_seq)
        if fresh:
            run_totals_apply(run=run, ranges=ranges, fresh=fresh, batch=samples)
    except DataError:  # a number Postgres cannot store or compute with (the caller's transaction rolls back)
        raise out_of_range(samples) from None
    return IngestResult(received=len(samples), inserted=len(fresh), duplicates=len(samples) - len(fresh))


def run_totals_apply(*, run: Run, ranges: list[tuple[int, int]], fresh: list[int] | None,
                     batch: list | None = None) -> None:
    """Move the run's totals by what `fresh` (the seqs just stored) changed in its bill.

    Re-prices the intervals the new rows close and the one after each, wherever they landed.
    fresh=None: recompute the whole bill from the stored samples. Caller holds the row lock.
    A batch whose timestamps go backwards against seq (within an attempt, against each other or
    against the stored rows around them) is refused: the caller's transaction rolls back.
    """
    cost_model = run.experiment.cost_model
    schedule = price_schedule(
        tenant_id=run.tenant_id, gpu_sku_id=run.gpu_sku_id, pinned_table_id=run.experiment.pricing_table_id
    )
    delta = usage_delta(
        run_id=run.pk, ranges=ranges, fresh=fresh, gpu_count=run.gpu_count, vcpus=run.vcpus,
        memory_gb=run.memory_gb, boundaries=schedule.boundaries, modelled_power_w=_modelled_power_w(run),
    )
    if delta.backwards_seq is not None:
        _refuse_backwards(delta.backwards_seq, fresh or [], batch or [])
    weights = cost_engine.Weights.from_cost_model(cost_model)
    usage, cost = cost_engine.Usage.zero(), cost_engine.CostBreakdown.zero()
    for p in delta.periods:
        priced = cost_engine.resource_weighted_cost(p.usage, schedule.period_prices(p.period), weights)
        if p.sign > 0:
            usage, cost = usage + p.usage, cost + priced
        else:
            usage, cost = usage - p.usage, cost - priced
    added = [p for p in delta.periods if p.sign > 0]

    total = dataclasses.asdict(cost)
    if fresh is None:  # a recompute: the figures are the bill, not a change to it
        breakdown = {"units": 0}
        run.tokens, run.device_seconds, run.energy_j, run.steps = 0, 0.0, 0.0, 0
        run.energy_estimated = False
    else:
        breakdown = dict(run.cost_breakdown or {})
    for key, value in total.items():
        breakdown[key] = breakdown.get(key, 0.0) + value
    run.tokens += usage.tokens
    run.device_seconds += usage.device_seconds if run.gpu_count else usage.wall_s
    run.energy_j += usage.energy_j
    run.steps = max([run.steps, *(p.max_step for p in added)])
    run.energy_estimated = run.energy_estimated or any(p.estimated for p in added)
    if cost_model.kind == CostModel.Kind.TIERED_PER_CALL:
        # Tiers apply to the run's cumulative units: priced from zero, whatever order they came in.
        units = usage.steps if cost_model.unit == CostModel.Unit.STEP else usage.tokens
        breakdown["units"] = breakdown.get("units", 0) + units
        breakdown["tiered_usd"] = cost_engine.tiered_cost(0, breakdown["units"], cost_model.tiers)
        bill = breakdown["tiered_usd"]
    else:
        bill = breakdown["total_usd"]
    last = max(run.last_seq, max(fresh)) if fresh else run.last_seq
    run.last_seq = run.priced_seq = last
    run.cost_breakdown = breakdown
    run.cost_usd = Decimal(str(round(bill, 6)))
    run.save(update_fields=[
        "priced_seq", "last_seq", "steps", "tokens", "device_seconds", "energy_j", "energy_estimated",
        "cost_breakdown", "cost_usd", "updated_at",
    ])


def run_totals_recompute(*, run: Run) -> None:
    """The run's totals from all its stored samples (at finish: whatever arrived late is in)."""
    run_totals_apply(run=run, ranges=[(-1, SEQ_MAX)], fresh=None)


def _modelled_power_w(run: Run) -> float:
    """Board power of the run's GPUs: what an interval reporting neither energy nor power is modelled at."""
    if not run.gpu_count or run.gpu_sku_id is None:
        return 0.0
    return float(run.gpu_sku.tdp_w) * run.gpu_count


def _refuse_backwards(seq: int, fresh: list[int], batch: list) -> None:
    """Name the batch's sample to blame: the one at `seq`, or the new one just before it."""
    culprit = seq if seq in set(fresh) else max((s for s in fresh if s < seq), default=seq)
    index = next((i for i, s in enumerate(batch) if isinstance(s, dict) and s.get("seq") == culprit), 0)
    where = f"samples[{index}].ts"
    reason = f"goes backwards against seq (seq {culprit} is timed before a sample with a lower seq, or after one " \
             f"with a higher seq)"
    raise ApplicationError(f"{where}: {reason}", {"fields": {where: [reason]}}, code="invalid")


def run_totals_advance(*, run: Run, final: bool = True) -> None:
    """Close a run's totals (the name apps.experiments.leases calls): a full recompute."""
    run_totals_recompute(run=run)
