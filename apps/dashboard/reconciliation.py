"""The reconciliation page: per team of the user, a month of costlab's bill against the cloud's
invoice (billing's reconciliation: totals, the biggest differences, idle and unmatched by
resource)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Max
from django.utils import timezone

from apps.billing.interface import Reconciliation, month_bounds, reconciliation
from apps.core.exceptions import ApplicationError
from apps.dashboard.selectors import tenants_of
from apps.pricing.models import FocusUsage
from apps.tenants.models import Tenant


@dataclass(frozen=True)
class TenantReconciliation:
    tenant: Tenant
    found: Reconciliation | None
    missing: str  # why there is none: no invoice imported for the month
    totals: dict | None = None
    differences: list | None = None
    idle: list | None = None
    unmatched: list | None = None


def default_period(*, tenants: list[Tenant]) -> str:
    """The latest month an imported invoice of these teams bills a day of, else this month."""
    latest = FocusUsage.objects.filter(
        focus_import__tenant__in=tenants, focus_import__usage_stored=True
    ).aggregate(day=Max("day"))["day"]
    return (latest or timezone.now().astimezone(UTC).date()).strftime("%Y-%m")


def reconciliation_page(*, user, period: str | None) -> dict:
    """Per team of the user, the month `period` (YYYY-MM; default: the latest month with an
    imported invoice) reconciled; ValueError naming the period when it is not a month."""
    tenants = list(tenants_of(user=user))
    period = period or default_period(tenants=tenants)
    start, end = month_bounds(period)
    out = []
    for tenant in tenants:
        try:
            found = reconciliation(tenant=tenant, period=period)
        except ApplicationError as exc:
            out.append(TenantReconciliation(tenant=tenant, found=None, missing=exc.message))
            continue
        out.append(
            TenantReconciliation(
                tenant=tenant,
                found=found,
                missing="",
                totals=found.totals(),
                differences=found.biggest_differences(),
                idle=found.idle_by_resource(),
                unmatched=found.unmatched_by_resource(),
            )
        )
    this_month = datetime.combine(
        timezone.now().astimezone(UTC).date().replace(day=1), datetime.min.time(), UTC
    )
    return {
        "period": period,
        "month": start.date(),
        "previous": (start - timedelta(days=1)).date().replace(day=1),
        "next": end.date() if end <= this_month else None,
        "tenants": out,
    }
