"""costlab's allocation as FOCUS 1.2: one Usage row per run and UTC day of a month, with the run's
bill of that day, for the FinOps tools that read the cloud's own FOCUS export beside it.

A run's day is its bill split by its telemetry: the run's stored samples are billed again with the
price schedule it was billed with (apps.billing.bill, the price versions in force, or the table its
experiment is pinned to, or the table of its last re-price), with every UTC midnight added to the
schedule's boundaries, so an interval across midnight falls on both days by its time. Each day
then takes the share of the run's stored cost (Run.cost_usd) that its recomputed bill has, so the
days add up to the stored bill to the micro-dollar. A run whose raw samples retention dropped, or
whose telemetry bills nothing, is split by wall time between its first and last sample instead
(x_CostlabSplit says which).

BilledCost, EffectiveCost, ListCost and ContractedCost are that figure: costlab's bill knows no list
price or discount of its own. PricingQuantity is GPU-hours (a GPU run: PricingUnit Hours, one
GPU each, x_CostlabGpuSku the SKU) or vCPU-hours (a CPU run), so importing this file
(apps.pricing.focus) prices a GPU-hour and a vCPU-hour at exactly the month's cost of them.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Prefetch, Q, QuerySet

from apps.billing import cost_engine
from apps.billing.bill import period_sums
from apps.experiments.models import Run
from apps.pricing.focus import MANDATORY
from apps.pricing.models import CostModel
from apps.pricing.selectors import price_schedule
from apps.telemetry.compaction import stored_rows
from apps.telemetry.models import RunRepricing
from apps.telemetry.rollup import BILL_FIELDS
from apps.tenants.models import Tenant

FOCUS_VERSION = "1.2"
MICRO = Decimal("0.000001")
# FOCUS 1.2's mandatory columns and the conditional ones costlab fills, in FOCUS's alphabetical
# order; then costlab's own, x_-prefixed as FOCUS asks of a data generator's columns.
FILLED = (
    "BillingAccountType",
    "ChargeFrequency",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedUnitPrice",
    "InvoiceId",
    "ListUnitPrice",
    "PricingCategory",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceSubcategory",
    "SkuId",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
)
COSTLAB_COLUMNS = (
    "x_CostlabResource",
    "x_CostlabGpuSku",
    "x_CostlabGpuCount",
    "x_CostlabVcpus",
    "x_CostlabRunId",
    "x_CostlabRunStatus",
    "x_CostlabExperimentId",
    "x_CostlabArm",
    "x_CostlabWallHours",
    "x_CostlabEnergyKwh",
    "x_CostlabSplit",
)
COLUMNS = (*sorted({*MANDATORY[FOCUS_VERSION], *FILLED}), *COSTLAB_COLUMNS)


def month_bounds(period: str) -> tuple[datetime, datetime]:
    """'YYYY-MM' -> [its first instant, the next month's first instant) in UTC; ValueError with
    the reason otherwise."""
    try:
        start = datetime.strptime(str(period), "%Y-%m").replace(tzinfo=UTC)
        end = (start + timedelta(days=32)).replace(day=1)
    except (OverflowError, ValueError):
        raise ValueError(f"{period!r} is not a month written YYYY-MM") from None
    return start, end


@dataclass
class Day:
    share: float = 0.0  # what the day's usage costs at the run's prices (or its units, tiered)
    wall_s: float = 0.0
    device_s: float = 0.0
    vcpu_s: float = 0.0
    energy_j: float = 0.0


def _midnights(lo: datetime, hi: datetime) -> list[datetime]:
    day = datetime(lo.year, lo.month, lo.day, tzinfo=UTC)
    out = []
    while day <= hi:
        out.append(day)
        day += timedelta(days=1)
    out.append(day)
    return out


def _pinned_table(run: Run) -> int | None:
    """The table the run's bill was last priced at as a whole: its last re-price's (None: a
    re-price at the schedule), else its experiment's pinned table."""
    last = next(iter(run.repricings.all()), None)  # prefetched, newest first
    if last is not None:
        return last.pricing_table_id
    return run.experiment.pricing_table_id


def run_days(run: Run) -> tuple[dict[date, Day], str]:
    """The run's usage and bill share per UTC day, and how it was split ('telemetry' or
    'wall-time')."""
    if run.samples_from is None or run.samples_to is None:
        return {}, "none"
    if run.raw_dropped_before is None:
        days = _days_from_telemetry(run)
        if sum(d.share for d in days.values()) > 0:
            return days, "telemetry"
    return _days_by_wall_time(run), "wall-time"


def _days_from_telemetry(run: Run) -> dict[date, Day]:
    schedule = price_schedule(
        tenant_id=run.tenant_id,
        gpu_sku_id=run.gpu_sku_id,
        pinned_table_id=_pinned_table(run),
        as_of=run.prices_as_of or run.created_at,
    )
    edges = sorted(
        {b.timestamp() for b in schedule.boundaries}
        | {m.timestamp() for m in _midnights(run.samples_from, run.samples_to)}
    )
    streams = max(run.world_size, 1)
    modelled = (
        float(run.gpu_sku.tdp_w) * run.gpu_count / streams
        if run.gpu_count and run.gpu_sku_id is not None
        else 0.0
    )
    sums = period_sums(stored_rows(run, BILL_FIELDS), edges=edges, modelled_power_w=modelled)
    usage = sums.usage(
        gpu_count=run.gpu_count / streams,
        vcpus=run.vcpus / streams,
        memory_gb=run.memory_gb / streams,
    )
    cost_model = run.experiment.cost_model
    weights = cost_engine.Weights.from_cost_model(cost_model)
    tiered = cost_model.kind == CostModel.Kind.TIERED_PER_CALL
    days: dict[date, Day] = {}
    for period, u in usage.items():
        if period < 0:
            continue  # before every edge: no sample is there (the first edge is a midnight)
        start = datetime.fromtimestamp(edges[period], UTC)
        day = days.setdefault(start.date(), Day())
        if tiered:  # tiers price the run's cumulative units: a day's share is its units
            day.share += u.steps if cost_model.unit == CostModel.Unit.STEP else u.tokens
        else:
            prices = schedule.at(start)
            day.share += cost_engine.resource_weighted_cost(u, prices, weights).total_usd
        day.wall_s += u.wall_s
        day.device_s += u.device_seconds
        day.vcpu_s += u.vcpu_seconds
        day.energy_j += u.energy_j
    return days


def _days_by_wall_time(run: Run) -> dict[date, Day]:
    lo, hi = run.samples_from, run.samples_to
    span = max((hi - lo).total_seconds(), 0.0)
    days: dict[date, Day] = {}
    bounds = _midnights(lo, hi)
    for a, b in zip(bounds, bounds[1:], strict=False):
        seconds = (min(hi, b) - max(lo, a)).total_seconds()
        if seconds <= 0 and span > 0:
            continue
        share = seconds / span if span > 0 else 1.0
        days[a.date()] = Day(  # the run's totals are over every stream already
            share=share,
            wall_s=seconds,
            device_s=run.device_seconds * share if run.gpu_count else 0.0,
            vcpu_s=seconds * run.vcpus,
            energy_j=run.energy_j * share,
        )
        if span <= 0:
            break
    return days


def _allocate(total: Decimal, days: dict[date, Day]) -> dict[date, Decimal]:
    """The run's stored bill, split in proportion to its days' shares, to the micro-dollar: the
    last day takes what rounding left, so the days add up to the bill exactly."""
    whole = sum(d.share for d in days.values())
    out: dict[date, Decimal] = {}
    if not days:
        return out
    ordered = sorted(days)
    spent = Decimal("0")
    for day in ordered[:-1]:
        part = (total * Decimal(repr(days[day].share / whole))).quantize(
            MICRO, rounding=ROUND_HALF_UP
        )
        out[day] = part
        spent += part
    out[ordered[-1]] = total - spent
    return out


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(value: float | Decimal, places: int = 6) -> str:
    return f"{Decimal(repr(value)) if isinstance(value, float) else value:.{places}f}"


def runs_billed_in(*, tenant: Tenant, start: datetime, end: datetime) -> QuerySet[Run]:
    """The tenant's runs with billed telemetry in [start, end)."""
    return Run.objects.filter(tenant=tenant, samples_from__lt=end, samples_to__gte=start).filter(
        ~Q(cost_usd=0) | Q(device_seconds__gt=0)
    )


def run_day_costs(
    runs: QuerySet[Run], *, start: datetime, end: datetime
) -> Iterator[tuple[Run, datetime, Day, Decimal, str]]:
    """(run, the UTC day's midnight, its usage that day, its bill that day, how it was split) for
    each of `runs` and each day of it in [start, end), a run at a time: the days of a run add up
    to its stored bill to the micro-dollar."""
    runs = (
        runs.select_related("experiment__cost_model", "arm", "gpu_sku")
        .prefetch_related(
            Prefetch("repricings", queryset=RunRepricing.objects.order_by("-at", "-pk"))
        )
        .order_by("pk")
    )
    for run in runs.iterator(chunk_size=200):
        days, split = run_days(run)
        costs = _allocate(run.cost_usd, days)
        for day in sorted(days):
            moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if start <= moment < end:
                yield run, moment, days[day], costs[day], split


def focus_rows(*, tenant: Tenant, period: str) -> Iterator[dict]:
    """The tenant's allocation in the month `period` (YYYY-MM), as FOCUS 1.2 rows (dicts keyed by
    COLUMNS), a run at a time."""
    start, end = month_bounds(period)
    runs = runs_billed_in(tenant=tenant, start=start, end=end)
    for run, moment, day, cost, split in run_day_costs(runs, start=start, end=end):
        yield _row(run, tenant, start, end, moment, day, cost, split)


def _row(run, tenant, start, end, moment, day: Day, cost: Decimal, split: str) -> dict:
    sku = run.gpu_sku.name if run.gpu_sku_id is not None and run.gpu_count else ""
    if sku:
        resource, quantity, unit = "gpu-hours", day.device_s / 3600, "GPU-Hours"
        sku_id, details = f"costlab-gpu:{sku}", {"GpuCount": 1, "x_GpuSku": sku}
        what = f"GPU-hours of {run.gpu_count} x {sku}"
    elif run.vcpus:
        resource, quantity, unit = "vcpu-hours", day.vcpu_s / 3600, "vCPU-Hours"
        sku_id, details = "costlab-vcpu", {"CoreCount": 1}
        what = f"vCPU-hours of {run.vcpus} vCPUs"
    else:  # neither GPUs nor vCPUs held: its bill is energy alone, by the hour of the run
        resource, quantity, unit = "run-hours", day.wall_s / 3600, "Hours"
        sku_id, details = "costlab-run", {}
        what = "hours of a run holding neither GPUs nor vCPUs"
    quantity_d = Decimal(repr(quantity)).quantize(MICRO, rounding=ROUND_HALF_UP)
    unit_price = "" if not quantity_d else f"{cost / quantity_d:.10f}"
    money = f"{cost:.6f}"
    host = run.resource_id or "/".join(p for p in (run.host, run.device) if p)
    return {
        "BilledCost": money,
        "BillingAccountId": f"costlab:{tenant.slug}",
        "BillingAccountName": tenant.name,
        "BillingAccountType": "costlab tenant",
        "BillingCurrency": "USD",
        "BillingPeriodEnd": _iso(end),
        "BillingPeriodStart": _iso(start),
        "ChargeCategory": "Usage",
        "ChargeClass": "",
        "ChargeDescription": f"{what}: run {run.pk} ({run.experiment.name} / {run.arm.name})",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodEnd": _iso(moment + timedelta(days=1)),
        "ChargePeriodStart": _iso(moment),
        "ConsumedQuantity": str(quantity_d),
        "ConsumedUnit": unit,
        "ContractedCost": money,
        "ContractedUnitPrice": unit_price,
        "EffectiveCost": money,
        "InvoiceId": f"costlab:{tenant.slug}:{start:%Y-%m}",  # the tenant's statement of the month
        "InvoiceIssuerName": "costlab",
        "ListCost": money,
        "ListUnitPrice": unit_price,
        "PricingCategory": "Standard",
        "PricingQuantity": str(quantity_d),
        "PricingUnit": "Hours",
        "ProviderName": "costlab",
        "PublisherName": "costlab",
        "ResourceId": host or f"costlab-run-{run.pk}",
        "ResourceName": f"run {run.pk}",
        "ResourceType": "Training run",
        "ServiceCategory": "AI and Machine Learning",
        "ServiceName": "costlab training runs",
        "ServiceSubcategory": "AI Platforms",
        "SkuId": sku_id,
        "SkuPriceDetails": json.dumps(details, sort_keys=True) if details else "",
        "SkuPriceId": sku_id,
        "SubAccountId": f"experiment:{run.experiment_id}",
        "SubAccountName": run.experiment.name,
        "SubAccountType": "costlab experiment",
        "Tags": json.dumps(
            {"experiment": run.experiment.name, "arm": run.arm.name, "run": str(run.pk)},
            sort_keys=True,
        ),
        "x_CostlabResource": resource,
        "x_CostlabGpuSku": sku,
        "x_CostlabGpuCount": str(run.gpu_count),
        "x_CostlabVcpus": str(run.vcpus),
        "x_CostlabRunId": str(run.pk),
        "x_CostlabRunStatus": run.status,
        "x_CostlabExperimentId": str(run.experiment_id),
        "x_CostlabArm": run.arm.name,
        "x_CostlabWallHours": _num(day.wall_s / 3600),
        "x_CostlabEnergyKwh": _num(day.energy_j / 3_600_000),
        "x_CostlabSplit": split,
    }


def csv_lines(rows: Iterable[dict], columns: Sequence[str]) -> Iterator[str]:
    """Rows (dicts keyed by `columns`) as CSV text, a line at a time (the header first): streamed,
    never held."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")

    def flush() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writeheader()
    yield flush()
    for row in rows:
        writer.writerow(row)
        yield flush()


def focus_csv(*, tenant: Tenant, period: str) -> Iterator[str]:
    """The month's rows as CSV text, a line at a time (the header first): streamed, never held."""
    month_bounds(period)  # refused before the first line
    yield from csv_lines(focus_rows(tenant=tenant, period=period), COLUMNS)
