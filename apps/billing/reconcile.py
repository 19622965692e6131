"""A bill that reconciles: costlab's bill of a month against the cloud's invoice, per resource and
UTC day (docs/billing.md, "Reconciliation").

The invoice's side is a FOCUS import's usage (apps.pricing FocusUsage: per ResourceId and UTC
day, the counted rows' EffectiveCost, instance-hours, GPU-hours and vCPU-hours); costlab's side is
each run's bill per UTC day on the resource it recorded (Run.resource_id), split by its telemetry
exactly as the FOCUS export splits it (focus_export.run_day_costs). A run's resource matches an
invoice's ResourceId as written (case aside), else by its last path segment (an instance id
against its ARN, a VM's name against its Azure resource id) where that segment names one resource
of the invoice only.

Per resource and day, in the resource's unit (GPU-hours where its instance type has GPUs, else
vCPU-hours; K billed, U used by runs, C the invoice's cost, A costlab's):

- **attributed** A: costlab's bill of the runs on that resource that day;
- the **same hours** min(U, K); the invoice's cost of them C x min(U, K) / K, costlab's
  A x min(U, K) / U, and the **difference** costlab's minus the invoice's;
- **idle**: what the invoice billed for hours no run used, C minus its cost of the same hours (a
  resource-day with no run: all of C);
- **unmatched**: costlab's bill the invoice has no hours for: runs on a resource-day with no
  invoice row, runs that recorded no resource, and the hours runs used beyond the invoice's.

So invoice = invoice's same hours + idle, costlab = costlab's same hours + unmatched, exactly (in
Decimal; each split rounded to the micro-dollar, its rest kept beside it).

Queries are set-based: the invoice's resource-days in one aggregate; the runs within one UTC day
(most of them) in one aggregate; only runs across midnight are split a run at a time, as the
export splits them (two reads each: the run's price schedule and its stored samples).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import (
    Count,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Max,
    Min,
    OuterRef,
    Q,
    Sum,
    Value,
)
from django.db.models.functions import Greatest, TruncDate

from apps.billing.focus_export import csv_lines, month_bounds, run_day_costs, runs_billed_in
from apps.core.exceptions import ApplicationError
from apps.pricing.models import FocusImport, FocusUsage
from apps.tenants.models import Tenant

MICRO = Decimal("0.000001")
ZERO = Decimal(0)
GPU_HOURS, VCPU_HOURS = "GPU-hours", "vCPU-hours"
# How a resource-day stands: runs and an invoice row; the invoice alone; runs alone (their resource
# has no invoice row that day); runs that recorded no resource.
MATCHED, IDLE, UNMATCHED, UNRECORDED = "matched", "idle", "unmatched", "no resource recorded"
LISTED = 25  # rows of each list the JSON answer and the page show (the CSV has every one)


def _money(value: Decimal) -> Decimal:
    return value.quantize(MICRO, rounding=ROUND_HALF_UP)


def _hours(seconds: float | None) -> Decimal:
    return Decimal(repr((seconds or 0.0) / 3600)).quantize(MICRO, rounding=ROUND_HALF_UP)


@dataclass
class ResourceDay:
    """One resource on one UTC day: what the invoice billed, what costlab's runs used and cost,
    and the figures that compare them (settled by `settle`)."""

    resource_id: str
    day: date
    status: str = ""
    instance_types: str = ""
    invoice_rows: int = 0
    invoice_usd: Decimal = ZERO
    invoice_hours: Decimal = ZERO  # instance-hours
    invoice_gpu_hours: Decimal = ZERO
    invoice_vcpu_hours: Decimal = ZERO
    runs: int = 0
    run_resource_ids: set[str] = field(default_factory=set)  # as the runs recorded it
    run_gpu_hours: Decimal = ZERO
    run_vcpu_hours: Decimal = ZERO
    attributed_usd: Decimal = ZERO
    # settled
    unit: str = ""
    billed_hours: Decimal = ZERO  # K: the invoice's, in the unit
    used_hours: Decimal = ZERO  # U: the runs', in the unit
    same_hours: Decimal = ZERO
    invoice_same_usd: Decimal = ZERO
    costlab_same_usd: Decimal = ZERO
    difference_usd: Decimal = ZERO
    idle_usd: Decimal = ZERO
    idle_hours: Decimal = ZERO
    unmatched_usd: Decimal = ZERO
    beyond_hours: Decimal = ZERO  # the runs' hours the invoice did not bill

    @property
    def difference_pct(self) -> Decimal | None:
        if not self.invoice_same_usd:
            return None
        return (self.difference_usd / self.invoice_same_usd * 100).quantize(Decimal("0.0001"))

    def settle(self) -> None:
        invoiced = self.invoice_rows > 0
        if not invoiced:
            self.status = UNRECORDED if not self.resource_id else UNMATCHED
            self.unit = GPU_HOURS if self.run_gpu_hours or not self.run_vcpu_hours else VCPU_HOURS
            self.used_hours = self.run_gpu_hours if self.unit == GPU_HOURS else self.run_vcpu_hours
            self.beyond_hours = self.used_hours
            self.unmatched_usd = self.attributed_usd
            return
        self.status = MATCHED if self.runs else IDLE
        if self.invoice_gpu_hours:
            self.unit, billed, used = GPU_HOURS, self.invoice_gpu_hours, self.run_gpu_hours
        else:
            self.unit, billed, used = VCPU_HOURS, self.invoice_vcpu_hours, self.run_vcpu_hours
        self.billed_hours, self.used_hours = billed, used
        same = min(used, billed) if billed > 0 else ZERO
        self.same_hours = same
        self.invoice_same_usd = _money(self.invoice_usd * same / billed) if billed > 0 else ZERO
        self.idle_usd = self.invoice_usd - self.invoice_same_usd
        self.idle_hours = billed - same
        self.costlab_same_usd = _money(self.attributed_usd * same / used) if used > 0 else ZERO
        self.unmatched_usd = self.attributed_usd - self.costlab_same_usd
        self.beyond_hours = used - same
        self.difference_usd = self.costlab_same_usd - self.invoice_same_usd

    def shown(self) -> dict:
        pct = self.difference_pct
        return {
            "resource_id": self.resource_id,
            "day": self.day.isoformat(),
            "status": self.status,
            "instance_types": self.instance_types,
            "unit": self.unit,
            "invoice_usd": str(_money(self.invoice_usd)),
            "invoice_instance_hours": str(_money(self.invoice_hours)),
            "billed_hours": str(_money(self.billed_hours)),
            "runs": self.runs,
            "run_resource_ids": sorted(self.run_resource_ids),
            "used_hours": str(_money(self.used_hours)),
            "same_hours": str(_money(self.same_hours)),
            "attributed_usd": str(_money(self.attributed_usd)),
            "costlab_same_hours_usd": str(_money(self.costlab_same_usd)),
            "invoice_same_hours_usd": str(_money(self.invoice_same_usd)),
            "difference_usd": str(_money(self.difference_usd)),
            "difference_pct": None if pct is None else str(pct),
            "idle_usd": str(_money(self.idle_usd)),
            "idle_hours": str(_money(self.idle_hours)),
            "unmatched_usd": str(_money(self.unmatched_usd)),
            "beyond_invoice_hours": str(_money(self.beyond_hours)),
        }


CSV_COLUMNS = tuple(ResourceDay("", date.min).shown())


@dataclass
class Reconciliation:
    """A month of a tenant reconciled against one FOCUS import, per resource and UTC day."""

    tenant: Tenant
    period: str
    record: FocusImport
    imports: list[FocusImport]  # the tenant's imports with usage in the period, newest first
    rows: list[ResourceDay]

    def _sum(self, name: str, rows: list[ResourceDay] | None = None) -> Decimal:
        return sum((getattr(r, name) for r in (self.rows if rows is None else rows)), ZERO)

    def totals(self) -> dict:
        matched = [r for r in self.rows if r.status == MATCHED]
        invoice_same = self._sum("invoice_same_usd")
        difference = self._sum("difference_usd")
        unmatched = {
            "no_invoice_row_usd": self._sum(
                "unmatched_usd", [r for r in self.rows if r.status == UNMATCHED]
            ),
            "no_resource_recorded_usd": self._sum(
                "unmatched_usd", [r for r in self.rows if r.status == UNRECORDED]
            ),
            "beyond_invoice_hours_usd": self._sum("unmatched_usd", matched),
        }
        return {
            "invoice_usd": _money(self._sum("invoice_usd")),
            "costlab_usd": _money(self._sum("attributed_usd")),
            "attributed_usd": _money(self._sum("attributed_usd", matched)),
            "invoice_same_hours_usd": _money(invoice_same),
            "costlab_same_hours_usd": _money(self._sum("costlab_same_usd")),
            "difference_usd": _money(difference),
            "difference_pct": (difference / invoice_same * 100).quantize(Decimal("0.0001"))
            if invoice_same
            else None,
            "idle_usd": _money(self._sum("idle_usd")),
            "unmatched_usd": _money(self._sum("unmatched_usd")),
            "unmatched": {k: _money(v) for k, v in unmatched.items()},
            "resource_days": len(self.rows),
            "resource_days_matched": len(matched),
            "resource_days_idle": sum(1 for r in self.rows if r.status == IDLE),
            "resource_days_unmatched": sum(
                1 for r in self.rows if r.status in (UNMATCHED, UNRECORDED)
            ),
            "run_days": sum(r.runs for r in self.rows),
        }

    def biggest_differences(self, limit: int = LISTED) -> list[ResourceDay]:
        matched = [r for r in self.rows if r.status == MATCHED and r.difference_usd]
        return sorted(matched, key=lambda r: (-abs(r.difference_usd), r.resource_id, r.day))[:limit]

    def idle_by_resource(self, limit: int | None = LISTED) -> list[dict]:
        return _by_resource([r for r in self.rows if r.idle_usd], "idle_usd", "idle_hours")[:limit]

    def unmatched_by_resource(self, limit: int | None = LISTED) -> list[dict]:
        return _by_resource(
            [r for r in self.rows if r.unmatched_usd], "unmatched_usd", "beyond_hours"
        )[:limit]

    def shown(self, limit: int = LISTED) -> dict:
        r = self.record
        totals = self.totals()
        idle, unmatched = self.idle_by_resource(None), self.unmatched_by_resource(None)
        return {
            "period": self.period,
            "currency": r.currency,
            "focus_import": {
                "id": r.pk,
                "filename": r.filename,
                "sha256": r.sha256,
                "billing_account": r.billing_account,
                "invoice_ids": r.invoice_ids,
                "period_start": r.period_start,
                "period_end": r.period_end,
                "created_at": r.created_at.isoformat(),
            },
            "imports": [
                {"id": i.pk, "filename": i.filename, "created_at": i.created_at.isoformat()}
                for i in self.imports
            ],
            "totals": _texts(totals),
            "biggest_differences": [d.shown() for d in self.biggest_differences(limit)],
            "idle_by_resource": [_texts(i) for i in idle[:limit]],
            "idle_resources": len(idle),
            "unmatched_by_resource": [_texts(u) for u in unmatched[:limit]],
            "unmatched_resources": len(unmatched),
        }


def _texts(values: dict) -> dict:
    return {
        k: (str(v) if isinstance(v, Decimal) else _texts(v) if isinstance(v, dict) else v)
        for k, v in values.items()
    }


def _by_resource(rows: list[ResourceDay], money: str, hours: str) -> list[dict]:
    """Rows summed per resource (and status), the largest `money` first."""
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        entry = out.setdefault(
            (r.resource_id, r.status),
            {
                "resource_id": r.resource_id,
                "status": r.status,
                "instance_types": r.instance_types,
                "unit": r.unit,
                "days": 0,
                "runs": 0,
                "usd": ZERO,
                "hours": ZERO,
                "invoice_usd": ZERO,
            },
        )
        entry["days"] += 1
        entry["runs"] += r.runs
        entry["usd"] += getattr(r, money)
        entry["hours"] += getattr(r, hours)
        entry["invoice_usd"] += r.invoice_usd
    for entry in out.values():
        entry["usd"], entry["invoice_usd"] = _money(entry["usd"]), _money(entry["invoice_usd"])
        entry["hours"] = _money(entry["hours"])
    return sorted(out.values(), key=lambda e: (-e["usd"], e["resource_id"]))


# --- the figures ------------------------------------------------------------------------------


def _period(period: str) -> tuple[datetime, datetime]:
    try:
        return month_bounds(period)
    except ValueError as exc:
        raise ApplicationError(
            f"period: {exc}", {"fields": {"period": [str(exc)]}}, code="invalid"
        ) from None


def focus_imports_for(*, tenant: Tenant, start: datetime, end: datetime) -> list[FocusImport]:
    """The tenant's FOCUS imports with usage on a day in [start, end), newest first."""
    usage = FocusUsage.objects.filter(
        focus_import=OuterRef("pk"), day__gte=start.date(), day__lt=end.date()
    )
    return list(
        FocusImport.objects.filter(tenant=tenant, usage_stored=True)
        .filter(Exists(usage))
        .order_by("-created_at", "-pk")
    )


def _record(
    *, tenant: Tenant, period: str, imports: list[FocusImport], focus_import: int | None
) -> FocusImport:
    if focus_import is None:
        if not imports:
            raise ApplicationError(
                f"period: no FOCUS import of team '{tenant.slug}' bills a resource on a day of "
                f"{period}; import the month's invoice first (POST "
                "/api/v1/pricing-tables/import-focus/, or manage.py prices_import_focus)",
                {"fields": {"period": [f"no invoice imported for {period}"]}},
                code="no_invoice",
                status=404,
            )
        return imports[0]
    record = FocusImport.objects.filter(tenant=tenant, pk=focus_import).first()
    if record is None:
        raise ApplicationError(
            f"focus_import: no FOCUS import {focus_import} of team '{tenant.slug}'",
            {"fields": {"focus_import": ["not found"]}},
            code="not_found",
            status=404,
        )
    if not record.usage_stored:
        raise ApplicationError(
            f"focus_import: import {record.pk} ({record.filename or 'no file name'}) was made "
            "before costlab kept an invoice's usage per resource and day; delete it (admin: "
            "Pricing > FOCUS imports) and import the file again",
            {"fields": {"focus_import": ["no usage kept"]}},
            code="invalid",
        )
    if record not in imports:
        raise ApplicationError(
            f"period: FOCUS import {record.pk} bills no resource on a day of {period} (its "
            f"period: {record.period_start or '?'}..{record.period_end or '?'})",
            {"fields": {"period": [f"import {record.pk} has no usage in {period}"]}},
            code="no_invoice",
            status=404,
        )
    return record


def _matcher(invoiced: set[str]):
    """A run's resource id -> the invoice's ResourceId it names, or None: the same id (case
    aside), else the same last path segment where one invoice resource alone has it."""
    exact = {r.lower(): r for r in invoiced}
    segments: dict[str, str | None] = {}
    for r in invoiced:
        tail = r.rstrip("/").rsplit("/", 1)[-1].lower()
        segments[tail] = None if tail in segments else r

    def match(resource: str) -> str | None:
        if not resource:
            return None
        found = exact.get(resource.lower())
        if found is None:
            found = segments.get(resource.rstrip("/").rsplit("/", 1)[-1].lower())
        return found

    return match


def reconciliation(
    *, tenant: Tenant, period: str, focus_import: int | None = None
) -> Reconciliation:
    """The tenant's month `period` (YYYY-MM, UTC) against a FOCUS import (its id; default: the
    newest import with usage in the month), per resource and UTC day. ApplicationError naming
    `period` (its format; no import for it) or `focus_import` (not the tenant's; kept no usage)."""
    start, end = _period(period)
    imports = focus_imports_for(tenant=tenant, start=start, end=end)
    record = _record(tenant=tenant, period=period, imports=imports, focus_import=focus_import)
    days: dict[tuple[str, str, date], ResourceDay] = {}
    invoice = (
        FocusUsage.objects.filter(focus_import=record, day__gte=start.date(), day__lt=end.date())
        .values("resource_id", "day")
        .annotate(
            cost=Sum("effective_cost"),
            hours=Sum("hours"),
            gpu_hours=Sum("gpu_hours"),
            vcpu_hours=Sum("vcpu_hours"),
            rows=Sum("rows"),
            first_type=Min("instance_type"),
            last_type=Max("instance_type"),
        )
    )
    for row in invoice:
        types = row["first_type"]
        if row["last_type"] != types:
            types = f"{types} ... {row['last_type']}"
        days[("invoice", row["resource_id"], row["day"])] = ResourceDay(
            resource_id=row["resource_id"],
            day=row["day"],
            instance_types=types,
            invoice_rows=row["rows"],
            invoice_usd=row["cost"],
            invoice_hours=row["hours"],
            invoice_gpu_hours=row["gpu_hours"],
            invoice_vcpu_hours=row["vcpu_hours"],
        )
    match = _matcher({key[1] for key in days if key[1]})

    def add(resource: str, day: date, runs: int, cost: Decimal, gpu_h: Decimal, vcpu_h: Decimal):
        found = match(resource)
        key = ("invoice", found, day) if found is not None else ("runs", resource, day)
        entry = days.get(key)
        if entry is None:  # an invoiced resource with no row that day, or none at all
            entry = days[key] = ResourceDay(resource_id=found or resource, day=day)
        entry.runs += runs
        entry.run_resource_ids.add(resource)
        entry.attributed_usd += cost
        entry.run_gpu_hours += gpu_h
        entry.run_vcpu_hours += vcpu_h

    runs = runs_billed_in(tenant=tenant, start=start, end=end).annotate(
        first_day=TruncDate("samples_from", tzinfo=UTC),
        last_day=TruncDate("samples_to", tzinfo=UTC),
    )
    # A run within one UTC day: its whole bill and usage fall on it (the export's split gives it
    # all to that day), summed in SQL. GPU-hours of GPU runs; vCPU-hours of CPU runs (their
    # device_seconds are wall seconds summed over the streams, each holding vcpus / streams).
    one_day = (
        runs.filter(first_day=F("last_day"))
        .values("resource_id", "first_day")
        .annotate(
            n=Count("pk"),
            cost=Sum("cost_usd"),
            gpu_s=Sum("device_seconds", filter=Q(gpu_count__gt=0)),
            vcpu_s=Sum(
                ExpressionWrapper(
                    F("device_seconds") * F("vcpus") / Greatest(F("world_size"), Value(1)),
                    output_field=FloatField(),
                ),
                filter=Q(gpu_count=0),
            ),
        )
    )
    for row in one_day:
        add(
            row["resource_id"],
            row["first_day"],
            row["n"],
            row["cost"],
            _hours(row["gpu_s"]),
            _hours(row["vcpu_s"]),
        )
    # Runs across midnight: each day's share as the FOCUS export splits it (its telemetry).
    split: dict[tuple[str, date], list] = {}
    for run, moment, usage, cost, _how in run_day_costs(
        runs.exclude(first_day=F("last_day")), start=start, end=end
    ):
        sums = split.setdefault((run.resource_id, moment.date()), [0, ZERO, 0.0, 0.0])
        sums[0] += 1
        sums[1] += cost
        sums[2] += usage.device_s if run.gpu_count else 0.0
        sums[3] += 0.0 if run.gpu_count else usage.vcpu_s
    for (resource, day), (n, cost, gpu_s, vcpu_s) in split.items():
        add(resource, day, n, cost, _hours(gpu_s), _hours(vcpu_s))
    rows = sorted(days.values(), key=lambda r: (r.resource_id, r.day, r.status))
    for entry in rows:
        entry.settle()
    return Reconciliation(tenant=tenant, period=period, record=record, imports=imports, rows=rows)


def reconciliation_csv(rec: Reconciliation) -> Iterator[str]:
    """Every resource-day of a reconciliation as CSV text, a line at a time (the header first)."""
    rows = (
        row.shown() | {"run_resource_ids": " ".join(sorted(row.run_resource_ids))}
        for row in rec.rows
    )
    return csv_lines(rows, CSV_COLUMNS)
