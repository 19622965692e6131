"""Reads of prices: which table was in force when, and what a GPU-hour cost then."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime

from apps.pricing.cost_engine import Prices
from apps.pricing.models import GpuPrice, PricingTable

FREE = Prices(gpu_hour_usd=0, electricity_usd_per_kwh=0, pue=1, vcpu_hour_usd=0, memory_gb_hour_usd=0)


def pricing_table_valid_at(*, tenant_id: int, at: datetime) -> PricingTable | None:
    return (
        PricingTable.objects.filter(tenant_id=tenant_id, valid_from__lte=at).order_by("-valid_from").first()
    )


def prices_lookup(*, tenant_id: int, gpu_sku_id: int | None, pinned_table_id: int | None = None,
                  ) -> Callable[[datetime], Prices]:
    """A `prices_at(ts)` for one run: the table valid at ts (or the pinned one), in two queries.

    Before the tenant's first table there is no price: those intervals cost 0 (FREE below).
    """
    tables = PricingTable.objects.filter(tenant_id=tenant_id).order_by("valid_from")
    if pinned_table_id is not None:
        tables = tables.filter(pk=pinned_table_id)
    tables = list(tables)
    gpu_rates: dict[int, float] = {}
    if gpu_sku_id is not None and tables:
        gpu_rates = {
            table_id: float(rate)
            for table_id, rate in GpuPrice.objects.filter(
                pricing_table__in=tables, sku_id=gpu_sku_id
            ).values_list("pricing_table_id", "hourly_usd")
        }
    priced = [Prices.from_table(t, gpu_hour_usd=gpu_rates.get(t.pk, 0.0)) for t in tables]
    starts = [t.valid_from for t in tables]

    def prices_at(ts: datetime) -> Prices:
        if pinned_table_id is not None:
            return priced[0] if priced else FREE
        i = bisect.bisect_right(starts, ts) - 1
        return priced[i] if i >= 0 else FREE

    return prices_at
