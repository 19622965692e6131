"""Telemetry lands here: stored once per (run, seq) (a DDP run's ranks share its seq space), and
the run's totals move forward."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from operator import itemgetter

from django.conf import settings
from django.db import DatabaseError, DataError, transaction
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.utils import timezone

from apps.alerts.services import budget_event_record
from apps.billing import cost_engine, spend_estimate
from apps.billing.bill import Bill, period_sums, run_bill, unpriced_seconds
from apps.core.db import Compiled, fields_save, is_postgres
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.experiments.params import run_params_merge
from apps.experiments.selectors import month_start, tenant_month_spend
from apps.experiments.services import run_external_check, runs_stopping_push
from apps.pricing.models import CostModel, PricingTable
from apps.pricing.selectors import price_schedule
from apps.telemetry.compaction import stored_rows
from apps.telemetry.evaluations import evaluations_insert
from apps.telemetry.ingest import (
    clocks_clamp,
    counters_refuse_decreasing,
    out_of_range,
    samples_insert,
    samples_validate,
)
from apps.telemetry.metrics import metrics_insert
from apps.telemetry.models import RunRepricing
from apps.telemetry.rollup import (
    BILL_FIELDS,
    SEQ_MAX,
    batch_ranges,
    contiguous_end,
    rows_in_ranges,
    stream_predecessors,
)
from apps.telemetry.streams import streams_claim
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

_SEQ = itemgetter("seq")
# Samples stored beyond a gap before the gap-free mark stops waiting for it (about 2 minutes at 1
# s).
GAP_PATIENCE_SAMPLES = 120


@dataclass(frozen=True)
class IngestResult:
    received: int
    inserted: int
    duplicates: int
    # Samples refused alone ({index, seq, field, reason}); the rest of the batch landed.
    refused: list[dict] = field(default_factory=list)


# The tenant's fields the budget check after a priced batch needs: read with the run's locked
# read (annotations tenant_<field>), so that the check reads no tenant row of its own.
_TENANT_BUDGET_FIELDS = ("created_at", "monthly_budget_usd", "budget_state", "budget_month")


def _run_locked(**lookup):
    """The run, locked (its row only), with what pricing it needs and the tenant's budget fields;
    not its reported params (read only by a batch that brings some: run_params_merge)."""
    return (
        Run.objects.select_for_update(of=("self",))
        .defer("params")
        .select_related("experiment__cost_model", "gpu_sku")
        .annotate(**{f"tenant_{f}": F(f"tenant__{f}") for f in _TENANT_BUDGET_FIELDS})
        .filter(**lookup)
    )


# Compiled once: the ORM's compile of this read cost more CPU than the read (apps.core.db).
_RUN_LOCKED = Compiled(_run_locked)


@transaction.atomic
def telemetry_ingest(
    *,
    run_id: int,
    samples: list,
    attempt: int | None = None,
    external: bool = False,
    tenant_id: int | None = None,
) -> IngestResult:
    """Validate and store a batch for a run; idempotent by (run, seq). Nothing partial on error.
    external: the run must be an external one, still running (checked under the same lock).
    tenant_id: the run must be that tenant's (Run.DoesNotExist otherwise), checked by the same
    locked read."""
    run = _run_for_batch(run_id=run_id, tenant_id=tenant_id, attempt=attempt, external=external)
    # A forward-stamped sample is refused alone, never stored: the window does not move for it.
    refused: list[dict] = []
    parsed = _samples_in_window(run, samples, refused=refused)
    if external:
        streams_claim(run=run, samples=parsed)
    batch_attempt = attempt or max(run.attempts, 1)
    stored_before = _stored_predecessor(run, parsed)
    same_attempt = stored_before is not None and stored_before["attempt"] == batch_attempt
    # Every batch is checked, the first included (an upload of 10,000 samples is one batch): a
    # dip inside it would otherwise be stored and its rebound billed.
    parsed = counters_refuse_decreasing(
        parsed, before=stored_before if same_attempt else None, sent=samples, refused=refused
    )
    seqs = sorted(s["seq"] for s in parsed)
    if not seqs:
        return IngestResult(received=len(samples), inserted=0, duplicates=0, refused=refused)
    appended = seqs[0] > run.last_seq
    # A forward stamp (in this batch or stored) is pulled back to the time after it, never a
    # reason to refuse the true samples that follow it.
    pulled, restamped = clocks_clamp(
        run=run, samples=parsed, attempt=batch_attempt, appended=appended
    )
    skewed_before = (run.cost_breakdown or {}).get("clock_skew_samples", 0)
    cost_before = run.cost_usd
    # The stored span, widened to the batch (saved with the totals): the reads below look inside it.
    stored = _samples_span_widen(run, parsed)
    # Before the insert: the stored rows around the batch bound what it can change.
    ranges = [(run.last_seq, SEQ_MAX)] if appended else batch_ranges(run=run, seqs=seqs)
    try:
        fresh = _batch_store(run, parsed, attempt=batch_attempt, stored=stored)
        if restamped:  # stored times moved: the run is billed again from all its samples
            run_totals_recompute(run=run)
        elif fresh:
            _totals_move(
                run,
                parsed,
                sent=samples,
                fresh=fresh,
                ranges=ranges,
                appended=appended,
                attempt=batch_attempt,
                stored=stored,
                stored_before=stored_before,
            )
    except DataError:
        # A number Postgres cannot store or compute with (the caller's transaction rolls back).
        raise out_of_range(samples) from None
    if pulled or restamped:  # said on the run: how many samples' clocks were pulled back
        _clock_skew_record(run, skewed=skewed_before + pulled + restamped)
    if fresh and run.cost_usd > cost_before:
        _budget_check_on_commit(run, increase=run.cost_usd - cost_before)
    return IngestResult(
        received=len(samples),
        inserted=len(fresh),
        duplicates=len(samples) - len(fresh) - len(refused),
        refused=refused,
    )


def _run_for_batch(
    *, run_id: int, tenant_id: int | None, attempt: int | None, external: bool
) -> Run:
    """The run, locked by one read, once it is known to take this batch (else refused)."""
    run = _RUN_LOCKED.get(pk=run_id, **({} if tenant_id is None else {"tenant_id": tenant_id}))
    if external:
        run_external_check(run, "take telemetry")
    _attempt_check(run, attempt)
    return run


def _attempt_check(run: Run, attempt: int | None) -> None:
    """Refuse a worker's batch from an attempt that no longer holds the run (409 stale_attempt)."""
    if (
        run.kind == Run.Kind.WORKER
        and attempt is not None
        and (run.status not in Run.ACTIVE_STATUSES or attempt != run.attempts)
    ):
        # A worker whose lease was swept must not write into the attempt that replaced it, nor
        # into a run whose totals are final. Swept and not yet taken again (queued, same attempt),
        # its last samples still land: they are what that attempt measured, and its finish may still
        # count.
        raise ApplicationError(
            f"attempt: attempt {attempt} no longer holds run {run.pk} (now {run.status}, "
            f"attempt {run.attempts})",
            {"fields": {"attempt": ["stale"]}},
            code="stale_attempt",
            status=409,
        )


def _samples_in_window(run: Run, samples: list, *, refused: list[dict]) -> list[dict]:
    """The batch's valid samples timed inside the run's clock window; the rest go to `refused`."""
    skew = timedelta(seconds=settings.COSTLAB_TELEMETRY_CLOCK_SKEW_S)
    ahead = timedelta(seconds=settings.COSTLAB_TELEMETRY_FUTURE_SKEW_S)
    start = min(run.created_at, run.started_at or run.created_at)
    latest, after = timezone.now() + ahead, "ahead of the server's clock"
    if run.declared_ended_at is not None and run.declared_ended_at + skew < latest:
        latest, after = run.declared_ended_at + skew, "after the run's declared ended_at"
    earliest, before = start - skew, "before the run started"
    days = settings.COSTLAB_TELEMETRY_RETENTION_DAYS
    if days > 0 and is_postgres() and timezone.now() - timedelta(days=days) > earliest:
        # Retention would drop it with its partition, unbilled run or not: refused now, and said.
        earliest = timezone.now() - timedelta(days=days)
        before = f"older than the telemetry retention of {days} days: it would be dropped"
    return samples_validate(
        samples,
        earliest=earliest,
        latest=latest,
        refused=refused,
        after_latest=after,
        before_earliest=before,
    )


def _stored_predecessor(run: Run, parsed: list[dict]) -> dict | None:
    """A single stream's stored sample just before the batch (None for a DDP run or none stored)."""
    if parsed and run.world_size == 1 and run.samples_from is not None:
        found = stream_predecessors(run=run, seq=min(s["seq"] for s in parsed) - 1, ranks=None)
        return found[0] if found else None
    return None


def _samples_span_widen(run: Run, parsed: list[dict]) -> tuple[datetime, datetime] | None:
    """Widen the run's span to the batch (reads stay in its days' partitions); the old span."""
    stored = None if run.samples_from is None else (run.samples_from, run.samples_to)
    first, last = min(s["ts"] for s in parsed), max(s["ts"] for s in parsed)
    run.samples_from = first if stored is None else min(stored[0], first)
    run.samples_to = last if stored is None else max(stored[1], last)
    return stored


def _batch_store(
    run: Run, parsed: list[dict], *, attempt: int, stored: tuple[datetime, datetime] | None
) -> list[int]:
    """Insert the batch's samples and what they carry (evaluations, metrics, params); the fresh."""
    fresh = samples_insert(
        run_id=run.pk,
        attempt=attempt,
        samples=parsed,
        after_seq=run.last_seq,
        stored=stored,
    )
    evaluations_insert(run_id=run.pk, samples=parsed, fresh=fresh)
    metrics_insert(run_id=run.pk, samples=parsed, fresh=fresh)
    run_params_merge(run_id=run.pk, samples=parsed, fresh=fresh)
    return fresh


def _totals_move(
    run: Run,
    parsed: list[dict],
    *,
    sent: list,
    fresh: list[int],
    ranges: list[tuple[int, int]],
    appended: bool,
    attempt: int,
    stored: tuple[datetime, datetime] | None,
    stored_before: dict | None,
) -> None:
    """Move the run's totals by the batch's fresh rows (those in hand, when it appended whole)."""
    _samples_attempt_track(run, attempt=attempt, stored=stored)
    if appended and len(fresh) == len(parsed):
        # An appended batch that went in whole: the rows are in hand, only the stored
        # predecessor is read, and there is no old figure to take off.
        now = _appended_rows(
            run, parsed, attempt=attempt, stored=stored, stored_before=stored_before
        )
        run_totals_apply(run=run, ranges=ranges, now=now, fresh=None, batch=sent)
    else:
        run_totals_apply(
            run=run,
            ranges=ranges,
            now=rows_in_ranges(run=run, ranges=ranges),
            fresh=set(fresh),
            batch=sent,
        )


def _samples_attempt_track(
    run: Run, *, attempt: int, stored: tuple[datetime, datetime] | None
) -> None:
    """Note whether every stored row still carries one attempt (stream_predecessors' short read)."""
    if stored is None:
        run.samples_attempt = attempt
    elif run.samples_attempt not in (None, attempt):
        run.samples_attempt = 0


def _appended_rows(
    run: Run,
    parsed: list[dict],
    *,
    attempt: int,
    stored: tuple[datetime, datetime] | None,
    stored_before: dict | None,
) -> list[list[dict]]:
    """An appended batch's rows in hand, after each stream's stored predecessor: one range."""
    for sample in parsed:
        sample["attempt"] = attempt
    if run.world_size > 1:  # each rank's stream continues from its own last row
        before = stream_predecessors(
            run=run,
            seq=run.last_seq,
            ranks={s["rank"] for s in parsed},
            stored_to=None if stored is None else stored[1],
        )
    else:  # read by telemetry_ingest: the row at run.last_seq, the highest stored
        before = [] if stored_before is None else [stored_before]
    return [before + sorted(parsed, key=_SEQ)]


def _clock_skew_record(run: Run, *, skewed: int) -> None:
    """Save on the run how many of its samples' clocks were pulled back, all batches together."""
    run.cost_breakdown = {
        **(run.cost_breakdown or {}),
        "clock_skew_samples": skewed,
    }
    fields_save(run, ["cost_breakdown"])


def _budget_check_on_commit(run: Run, *, increase: Decimal) -> None:
    """Check the tenant's budget once the batch that raised the run's cost by `increase` commits."""
    # After the commit, outside this run's row lock: the budget check touches the tenant's
    # other runs, which their own ingests lock.
    tenant = Tenant(
        pk=run.tenant_id, **{f: getattr(run, f"tenant_{f}") for f in _TENANT_BUDGET_FIELDS}
    )
    transaction.on_commit(lambda: _budget_enforce_after_commit(tenant, increase))


# What moving a run's totals saves on its row.
_TOTALS_FIELDS = (
    "priced_seq",
    "last_seq",
    "samples_from",
    "samples_to",
    "samples_attempt",
    "steps",
    "tokens",
    "device_seconds",
    "energy_j",
    "energy_estimated",
    "cost_breakdown",
    "cost_usd",
    "updated_at",
)


@dataclass
class _BillMove:
    """What some ranges' rows moved in a run's bill: usage, cost and the breakdown's counts."""

    usage: cost_engine.Usage = field(default_factory=cost_engine.Usage.zero)
    cost: cost_engine.CostBreakdown = field(default_factory=cost_engine.CostBreakdown.zero)
    estimated: bool = False
    max_step: int = 0
    modelled_intervals: int = 0
    reset_steps: int = 0
    unpriced: dict[str, float] = field(default_factory=dict)  # seconds with no price, by component


def run_totals_apply(
    *,
    run: Run,
    ranges: list[tuple[int, int]],
    now: list[list[dict]],
    fresh: set[int] | None,
    batch: list | None = None,
    recompute: bool = False,
    pricing_table_id: int | None = None,
) -> None:
    """Move the run's totals by what the rows `fresh` (just stored) changed in its bill.

    `now`: the stored rows of each (lo, hi] range, the row at lo included; each range is
    billed as it is now, minus as it was without `fresh` (fresh=None: nothing was there
    before). recompute: the ranges cover the run, and their bill replaces the totals.
    A batch whose timestamps go backwards against seq (within an attempt, against each other
    or the stored rows around them) is refused: the caller's transaction rolls back.
    pricing_table_id: price everything at that one table (a re-price); default the experiment's
    pinned table, else the tables in force over time. Caller holds the run's row lock.
    """
    cost_model = run.experiment.cost_model
    move = _ranges_bill_move(
        run,
        cost_model=cost_model,
        ranges=ranges,
        now=now,
        fresh=fresh,
        batch=batch,
        pricing_table_id=pricing_table_id,
    )
    if recompute:  # the figures are the bill, not a change to it
        breakdown: dict = {"units": 0}
        run.tokens, run.device_seconds, run.energy_j, run.steps = 0, 0.0, 0.0, 0
    else:
        breakdown = dict(run.cost_breakdown or {})
    _breakdown_move(breakdown, move)
    run.tokens += move.usage.tokens
    run.device_seconds += move.usage.device_seconds if run.gpu_count else move.usage.wall_s
    run.energy_j += move.usage.energy_j
    # Steps: the highest step seen, plus the steps reached before each declared counter reset.
    breakdown["max_step"] = max(breakdown.get("max_step", run.steps), move.max_step)
    breakdown["reset_steps"] = breakdown.get("reset_steps", 0) + move.reset_steps
    run.steps = max(run.steps, breakdown["max_step"] + breakdown["reset_steps"])
    run.energy_estimated = breakdown["estimated_samples"] or breakdown["modelled_intervals"] > 0
    bill = _bill_usd(breakdown, cost_model=cost_model, usage=move.usage)
    last = max([run.last_seq, *(rows[-1]["seq"] for rows in now if rows)])
    run.priced_seq = (
        last if recompute else _settled_seq(run, last=last, rows=now[0] if fresh is None else None)
    )
    run.last_seq = last
    run.cost_breakdown = breakdown
    run.cost_usd = Decimal(str(round(bill, 6)))
    fields_save(run, list(_TOTALS_FIELDS))


def _ranges_bill_move(
    run: Run,
    *,
    cost_model: CostModel,
    ranges: list[tuple[int, int]],
    now: list[list[dict]],
    fresh: set[int] | None,
    batch: list | None,
    pricing_table_id: int | None,
) -> _BillMove:
    """Each range's bill as it is now, minus as it was without `fresh`, summed over the ranges."""
    schedule = price_schedule(
        tenant_id=run.tenant_id,
        gpu_sku_id=run.gpu_sku_id,
        pinned_table_id=pricing_table_id or run.experiment.pricing_table_id,
        as_of=run.prices_as_of or run.created_at,
    )
    edges = [b.timestamp() for b in schedule.boundaries]
    resources = _stream_resources(run)
    modelled = _modelled_power_w(run)
    move = _BillMove()
    for (lo, _hi), rows in zip(ranges, now, strict=True):
        added = period_sums(rows, edges=edges, count_after=lo, modelled_power_w=modelled)
        if added.backwards_seq is not None:
            _refuse_backwards(added.backwards_seq, fresh or set(), batch or [])
        move.estimated = move.estimated or added.estimated
        move.max_step = max(move.max_step, added.max_step)
        move.modelled_intervals += added.modelled
        move.reset_steps += added.reset_steps
        parts = [(1, added)]
        if fresh is not None:
            old = [r for r in rows if r["seq"] not in fresh]
            parts.append(
                (-1, period_sums(old, edges=edges, count_after=lo, modelled_power_w=modelled))
            )
            move.modelled_intervals -= parts[-1][1].modelled
            move.reset_steps -= parts[-1][1].reset_steps
        for sign, sums in parts:
            _sums_price(move, sign, sums, resources=resources, schedule=schedule, model=cost_model)
    return move


def _stream_resources(run: Run) -> dict[str, float]:
    """The devices one telemetry stream holds: a DDP rank's share of the run's."""
    # A DDP run's samples come in one stream per rank, each with its own intervals: each stream
    # holds its share of the run's devices, so the streams' sum is the run's whole.
    streams = max(run.world_size, 1)
    return {
        "gpu_count": run.gpu_count / streams,
        "vcpus": run.vcpus / streams,
        "memory_gb": run.memory_gb / streams,
    }


def _sums_price(
    move: _BillMove, sign: int, sums, *, resources: dict, schedule, model: CostModel
) -> None:
    """Add (sign 1) or take off (sign -1) period sums' usage, cost and unpriced seconds."""
    weights = cost_engine.Weights.from_cost_model(model)
    for period, u in sums.usage(**resources).items():
        prices = schedule.period_prices(period)
        priced = cost_engine.resource_weighted_cost(u, prices, weights)
        if sign > 0:
            move.usage, move.cost = move.usage + u, move.cost + priced
        else:
            move.usage, move.cost = move.usage - u, move.cost - priced
        for component, seconds in unpriced_seconds(u, prices).items():
            move.unpriced[component] = move.unpriced.get(component, 0.0) + sign * seconds


def _breakdown_move(breakdown: dict, move: _BillMove) -> None:
    """Move the breakdown's estimate marks, cost lines and unpriced seconds by `move`."""
    # Estimated energy: a sample that says so (it stays stored), or an interval modelled now; a
    # late sample with power can take an interval's modelling back, so those are counted.
    breakdown["modelled_intervals"] = (
        breakdown.get("modelled_intervals", 0) + move.modelled_intervals
    )
    breakdown["estimated_samples"] = bool(breakdown.get("estimated_samples")) or move.estimated
    for key, value in dataclasses.asdict(move.cost).items():
        breakdown[key] = breakdown.get(key, 0.0) + value
    # Time billed where a component had no price (the SKU missing from the table in force, or no
    # table yet): never a silent $0 line (the API and the run page say "unpriced").
    # Carbon is not money: seconds without a grid intensity are kept apart (carbon_unpriced_s).
    seconds = dict(breakdown.get("unpriced_s") or {})
    seconds["carbon"] = breakdown.get("carbon_unpriced_s", 0.0)
    for component, moved in move.unpriced.items():
        seconds[component] = seconds.get(component, 0.0) + moved
    carbon = seconds.pop("carbon")
    breakdown["carbon_unpriced_s"] = round(carbon, 6) if carbon > 1e-6 else 0.0
    breakdown["unpriced_s"] = {c: round(v, 6) for c, v in sorted(seconds.items()) if v > 1e-6}


def _bill_usd(breakdown: dict, *, cost_model: CostModel, usage: cost_engine.Usage) -> float:
    """The run's bill in USD: its cumulative units through the tiers, else the weighted total."""
    if cost_model.kind == CostModel.Kind.TIERED_PER_CALL:
        # Tiers apply to the run's cumulative units: priced from zero, whatever order they came in.
        breakdown["units"] = breakdown.get("units", 0) + (
            usage.steps if cost_model.unit == CostModel.Unit.STEP else usage.tokens
        )
        breakdown["tiered_usd"] = cost_engine.tiered_cost(0, breakdown["units"], cost_model.tiers)
        return breakdown["tiered_usd"]
    return breakdown["total_usd"]


def _settled_seq(run: Run, *, last: int, rows: list[dict] | None) -> int:
    """The seq up to which the run's samples are gap-free (what the dashboard rolls up and
    attribution counts).

    Every stored sample is in the totals whatever its seq; a gap only holds this mark back, until
    it fills, for GAP_PATIENCE_SAMPLES (a sample lost for good), or until the run ends.
    `rows`: an appended batch with its stored predecessor, when that is what landed.
    """
    if (
        rows
        and run.priced_seq == run.last_seq
        and rows[-1]["seq"] - rows[0]["seq"] + 1 == len(rows)
        and rows[0]["seq"] == max(run.last_seq, 0)
    ):
        return last  # a batch continuing a gap-free run, with no hole of its own: no query
    end = contiguous_end(run=run, after_seq=run.priced_seq)
    settled = run.priced_seq if end is None else end
    return last if last - settled > GAP_PATIENCE_SAMPLES else settled


def run_totals_recompute(*, run: Run, pricing_table_id: int | None = None) -> None:
    """The run's totals from all its stored samples (at finish: whatever arrived late is in).

    Refused once retention dropped some of them: the bill made as they arrived stands."""
    if run.raw_dropped_before is not None:
        raise ApplicationError(
            f"run: run {run.pk}'s raw samples taken before "
            f"{run.raw_dropped_before.isoformat()} were dropped by telemetry retention "
            "(COSTLAB_TELEMETRY_RETENTION_DAYS); its bill stands as it was billed and cannot be "
            "recomputed or re-priced",
            {"fields": {"run": ["raw samples dropped by retention"]}},
            code="retention",
            status=409,
        )
    rows = list(stored_rows(run, BILL_FIELDS))  # raw and packed alike
    run_totals_apply(
        run=run,
        ranges=[(-1, SEQ_MAX)],
        now=[rows],
        fresh=None,
        recompute=True,
        pricing_table_id=pricing_table_id,
    )


@transaction.atomic
def run_reprice(
    *, run_id: int, actor, reason: str, pricing_table: PricingTable | None = None
) -> RunRepricing:
    """Re-price a finished run, audited: at one table (all of it), or again at the tables in force
    when it ran.

    A finished run's bill is final; this is the one deliberate way to change it (a newer price
    list, a correction). The run's moved cost reaches attribution at its next window.
    """
    if not reason.strip():
        raise ApplicationError(
            "reason: say why the run is re-priced (kept for audit)",
            {"fields": {"reason": ["required"]}},
            code="invalid",
        )
    run = (
        Run.objects.select_for_update(of=("self",))
        .select_related("experiment__cost_model", "gpu_sku")
        .get(pk=run_id)
    )
    if run.status in Run.ACTIVE_STATUSES:
        raise ApplicationError(
            f"status: run {run.pk} is {run.status}; only a finished run is re-priced",
            code="run_active",
            status=409,
        )
    if pricing_table is not None and pricing_table.tenant_id != run.tenant_id:
        raise ApplicationError(
            "pricing_table: not a table of the run's tenant",
            {"fields": {"pricing_table": ["other tenant"]}},
            code="invalid",
        )
    before = run.cost_usd
    if pricing_table is None:
        # Again at the tables in force when it ran, retroactive versions included: the one way a
        # version posted after the run opened reaches the run's past.
        run.prices_as_of = timezone.now()
        run.save(update_fields=["prices_as_of", "updated_at"])
    run_totals_recompute(run=run, pricing_table_id=pricing_table.pk if pricing_table else None)
    return RunRepricing.objects.create(
        run=run,
        actor=actor,
        reason=reason[:4000],
        pricing_table=pricing_table,
        cost_before_usd=before,
        cost_after_usd=run.cost_usd,
    )


def _modelled_power_w(run: Run) -> float:
    """Board power of the GPUs behind one telemetry stream (a DDP rank's share): what an interval
    reporting neither energy nor power is modelled at."""
    if not run.gpu_count or run.gpu_sku_id is None:
        return 0.0
    return float(run.gpu_sku.tdp_w) * run.gpu_count / max(run.world_size, 1)


def _refuse_backwards(seq: int, fresh: set[int], batch: list) -> None:
    """Name the batch's sample to blame: the one at `seq`, or the new one just before it."""
    mine = fresh or {s.get("seq") for s in batch if isinstance(s, dict)}
    culprit = (
        seq
        if seq in mine
        else max((s for s in mine if isinstance(s, int) and s < seq), default=seq)
    )
    index = next(
        (i for i, s in enumerate(batch) if isinstance(s, dict) and s.get("seq") == culprit), 0
    )
    where = f"samples[{index}].ts"
    reason = (
        f"goes backwards against seq (seq {culprit} is timed before a sample with a lower "
        "seq, or after one with a higher seq)"
    )
    raise ApplicationError(f"{where}: {reason}", {"fields": {where: [reason]}}, code="invalid")


BUDGET_WARN_SHARE = Decimal("0.8")
_BUDGET_RANK = {
    Tenant.BudgetState.OK: 0,
    Tenant.BudgetState.WARNED: 1,
    Tenant.BudgetState.EXCEEDED: 2,
}


def _budget_enforce_after_commit(tenant: Tenant, increase: Decimal) -> None:
    """The batch is stored whatever the check meets: a failure is logged, and the next priced
    batch checks again. The exact check runs only where the shared estimate of the month's spend,
    moved by this batch, could mean another budget state (apps.billing.spend_estimate).

    `tenant`: its budget fields as the batch's locked read of the run saw them, a few ms before
    the commit. A step another batch took in between is only checked again (budget_enforce takes
    a step once); a budget edited in between is seen by the next batch's check."""
    tenant_id = tenant.pk
    try:
        estimate = spend_estimate.add(tenant=tenant, usd=increase)
        if estimate is not None:
            month = tenant.budget_month
            prior = tenant.budget_state if month == month_start().date() else Tenant.BudgetState.OK
            if _budget_state(estimate, tenant.monthly_budget_usd) == prior:
                return
        budget_enforce(tenant_id=tenant_id)
    except DatabaseError:
        logger.exception("tenant %s: budget check failed; the next priced batch retries", tenant_id)


def _budget_state(spent: Decimal, budget: Decimal) -> str:
    if spent >= budget:
        return Tenant.BudgetState.EXCEEDED
    if spent >= BUDGET_WARN_SHARE * budget:
        return Tenant.BudgetState.WARNED
    return Tenant.BudgetState.OK


def budget_enforce(*, tenant_id: int) -> str:
    """The tenant's monthly budget, checked as the bill moves (after each priced batch).

    At 80 % of it every running run gets a warning note; at 100 % running worker runs are asked
    to stop at their next step (a cancel, with the reason in their notes), external runs are
    flagged in theirs, and submits are refused (run_submit's quota check). Each step is taken
    once a month: the state moves up with a conditional UPDATE, so two batches crossing it
    together act once. A step is recorded (a BudgetEvent naming the runs acted on) and alerted
    to the tenant's tenant-wide alert channels, in the step's transaction, sent once it commits.
    A raised budget moves the state back down. Returns the state."""
    tenant = Tenant.objects.get(pk=tenant_id)
    month = month_start().date()
    before = spend_estimate.before_sum(tenant=tenant)
    spent, budget = tenant_month_spend(tenant_id=tenant_id), tenant.monthly_budget_usd
    spend_estimate.seed(tenant=tenant, spent=spent, before=before)
    state = _budget_state(spent, budget)
    prior = tenant.budget_state if tenant.budget_month == month else Tenant.BudgetState.OK
    if _BUDGET_RANK[state] <= _BUDGET_RANK[prior]:
        if state != prior:  # the budget was raised: say where it stands now, stop nothing
            Tenant.objects.filter(pk=tenant_id).update(budget_state=state, budget_month=month)
        return state
    higher = [s for s, rank in _BUDGET_RANK.items() if rank >= _BUDGET_RANK[state]]
    with transaction.atomic():  # the step, its notes and its alerts: all or none
        moved = (
            Tenant.objects.filter(pk=tenant_id)
            .exclude(budget_month=month, budget_state__in=higher)
            .update(budget_state=state, budget_month=month)
        )
        if not moved:
            return state  # another batch took this step first
        _budget_step(tenant=tenant, month=month, state=state, spent=spent, budget=budget)
    return state


def _budget_step(
    *, tenant: Tenant, month: date, state: str, spent: Decimal, budget: Decimal
) -> None:
    """What a step to `state` does to the tenant's running runs, recorded and alerted."""
    share = spent / budget if budget else Decimal(1)
    said = (
        f"{timezone.now():%Y-%m-%d %H:%M} UTC budget: {spent:.2f} of {budget} USD spent this month"
    )
    running = Run.objects.filter(tenant_id=tenant.pk, status=Run.Status.RUNNING)

    def note_on(kind: str | None, note: str, **fields) -> list[int]:
        """Append the note to the running runs (of one kind); their ids. Locked as they are
        read (in pk order), so the ids recorded are the runs the note went to."""
        runs = running if kind is None else running.filter(kind=kind)
        ids = list(runs.select_for_update().order_by("pk").values_list("pk", flat=True))
        Run.objects.filter(pk__in=ids).update(notes=Concat("notes", Value(note + "\n")), **fields)
        return ids

    if state == Tenant.BudgetState.EXCEEDED:
        cancelled = note_on(
            Run.Kind.WORKER,
            f"{said} ({share:.0%}): the budget is spent; this run was stopped at its next step",
            cancel_requested=True,
        )
        runs_stopping_push(cancelled)
        runs = {
            "cancelled": cancelled,
            "flagged": note_on(
                Run.Kind.EXTERNAL,
                f"{said} ({share:.0%}): the budget is spent; stop this run (new submits are "
                "refused)",
            ),
        }
        reason = (
            f"{said} ({share:.0%}): the budget is spent; running worker runs stop at their next "
            "step, running external runs are flagged, new submits are refused"
        )
    else:
        reason = f"{said} ({share:.0%}): 80 % of the monthly budget is reached"
        runs = {"noted": note_on(None, reason)}
    # Recorded and alerted in the step's transaction (sent once it commits): alerts sit below
    # billing and take the step's figures as they are.
    budget_event_record(
        tenant=tenant,
        month=month,
        state=state,
        spend_usd=spent,
        budget_usd=budget,
        reason=reason,
        runs=runs,
    )
    logger.warning("tenant %s: %s (%s)", tenant.slug, said, state)


def samples_bill(
    *,
    samples: list[dict],
    after: dict,
    tenant_id: int,
    gpu_sku,
    cost_model: CostModel | None,
    gpu_count: int,
    vcpus: int,
    as_of: datetime | None = None,
) -> Bill:
    """The bill of samples that belong to no run (a strategy-search probe's timed stretch,
    `after` the sample that opens it), by the rules a run is billed by: apps.billing.bill over
    the tenant's price schedule (versions created after `as_of`, the probe's start, only from
    their creation), board power modelled the same way, unpriced time marked."""
    schedule = price_schedule(
        tenant_id=tenant_id, gpu_sku_id=getattr(gpu_sku, "pk", None), as_of=as_of
    )
    rows = [{"attempt": 1, "rank": 0, "estimated": False, **s} for s in (after, *samples)]
    return run_bill(
        rows,
        starts=schedule.starts,
        prices=schedule.prices,
        weights=cost_engine.Weights.from_cost_model(cost_model)
        if cost_model
        else cost_engine.Weights(),
        gpu_count=gpu_count,
        vcpus=vcpus,
        modelled_power_w=float(gpu_sku.tdp_w) * gpu_count if gpu_sku is not None else 0.0,
        count_after=after["seq"],
    )


def run_totals_close(sender, *, run: Run, **kwargs) -> None:
    """Receiver of apps.experiments.runs.run_ending: a run's bill is closed from all its stored
    samples."""
    run_totals_recompute(run=run)


def run_external_ingest(
    *, run_id: int, tenant_id: int, samples: list, attempt: int | None = None
) -> IngestResult:
    """Store a telemetry batch of the tenant's running external run (idempotent by seq);
    Run.DoesNotExist where the tenant has no such run. telemetry_ingest's transaction is the
    only one."""
    return telemetry_ingest(
        run_id=run_id, samples=samples, attempt=attempt, external=True, tenant_id=tenant_id
    )
