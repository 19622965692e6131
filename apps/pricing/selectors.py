"""Reads of prices: which table was in force when, and what a GPU-hour cost then."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime

from django.db.models import OuterRef, Q, QuerySet, Subquery

from apps.core.db import Compiled
from apps.pricing.models import CostModel, GpuPrice, PricingTable
from apps.pricing.prices import FREE, Prices


def pricing_table_valid_at(*, tenant_id: int, at: datetime) -> PricingTable | None:
    return (
        PricingTable.objects.filter(tenant_id=tenant_id, valid_from__lte=at)
        .order_by("-valid_from")
        .first()
    )


@dataclass(frozen=True)
class PriceSchedule:
    """A run's prices over time: period i runs from starts[i] until starts[i + 1]."""

    starts: list[datetime]
    prices: list[Prices]
    pinned: Prices | None = None

    def period_prices(self, period: int) -> Prices:
        if self.pinned is not None:
            return self.pinned
        return self.prices[period] if period >= 0 else FREE

    def at(self, ts: datetime) -> Prices:
        """The prices in force at ts (the `prices_at` of tests.pricing_reference.price_samples)."""
        return self.period_prices(bisect.bisect_right(self.starts, ts) - 1)

    @property
    def boundaries(self) -> list[datetime]:
        return [] if self.pinned is not None else self.starts


def effective_starts(tables: list[PricingTable], *, as_of: datetime | None) -> list:
    """[(start, table)] in start order: from `start` on, `table` prices what is billed.

    A version created after `as_of` (a retroactive table posted while a run was open) counts only
    from its creation, never back to its valid_from: prices never move an open run's past
    silently. Among the versions in force at a moment, the latest valid_from wins. as_of None:
    every version from its valid_from (an explicit, audited re-price).
    """

    def start(t: PricingTable) -> datetime:
        late = as_of is not None and t.created_at > as_of and t.retroactive
        return t.created_at if late else t.valid_from

    out: list = []
    winner = None
    for t in sorted(tables, key=lambda t: (start(t), t.valid_from)):
        if winner is not None and t.valid_from < winner.valid_from:
            continue  # an older version becoming eligible late never takes over from a newer one
        winner = t
        if out and out[-1][0] == start(t):
            out[-1] = (start(t), t)
        else:
            out.append((start(t), t))
    return out


def _tables(*, tenant_id: int, pk: int | None = None, sku_id: int | None = None) -> QuerySet:
    """The tenant's tables (or one), oldest first, with the SKU's rate where one is named."""
    tables = PricingTable.objects.filter(tenant_id=tenant_id).order_by("valid_from")
    if pk is not None:
        tables = tables.filter(pk=pk)
    if sku_id is not None:
        rate = GpuPrice.objects.filter(pricing_table=OuterRef("pk"), sku_id=sku_id)
        tables = tables.annotate(sku_hourly_usd=Subquery(rate.values("hourly_usd")[:1]))
    return tables


# Compiled once per shape (pinned or not, a SKU or not): apps.core.db.Compiled.
_TABLES = Compiled(_tables)


def price_schedule(
    *,
    tenant_id: int,
    gpu_sku_id: int | None,
    pinned_table_id: int | None = None,
    as_of: datetime | None = None,
) -> PriceSchedule:
    """Every pricing table of the tenant (or just the pinned one) with this SKU's rate, in one
    query; versions created after `as_of` count from their creation (effective_starts)."""
    lookup = {"tenant_id": tenant_id}
    if pinned_table_id is not None:
        lookup["pk"] = pinned_table_id
    if gpu_sku_id is not None:
        lookup["sku_id"] = gpu_sku_id
    tables = _TABLES.all(**lookup)

    # A GPU run's SKU without a rate in a table: that table's GPU time is unpriced, not free.
    def prices(t: PricingTable) -> Prices:
        return Prices.from_table(t, gpu_hour_usd=t.sku_hourly_usd if gpu_sku_id else 0)

    if pinned_table_id is not None:
        return PriceSchedule(starts=[], prices=[], pinned=prices(tables[0]) if tables else FREE)
    periods = effective_starts(tables, as_of=as_of)
    return PriceSchedule(starts=[s for s, _ in periods], prices=[prices(t) for _, t in periods])


def pricing_table_list(*, tenant) -> QuerySet[PricingTable]:
    """A tenant's tables, newest first, with their GPU prices (two queries in all)."""
    return (
        PricingTable.objects.filter(tenant=tenant)
        .prefetch_related("gpu_prices__sku")
        .order_by("-valid_from")
    )


def cost_model_list(*, tenant) -> QuerySet[CostModel]:
    return CostModel.objects.filter(tenant=tenant).order_by("name", "pk")


def pricing_tables_in_force(*, tenant_ids: set[int], pinned_ids: set[int], at: datetime) -> dict:
    """The comparison tables at `at`, in one query: {("tenant", id): table in force, ("pinned", id):
    table}."""
    out: dict = {}
    rows = PricingTable.objects.filter(
        Q(tenant_id__in=tenant_ids, valid_from__lte=at) | Q(pk__in=pinned_ids)
    )
    for table in rows.order_by("valid_from"):  # the latest in force wins
        if table.pk in pinned_ids:
            out[("pinned", table.pk)] = table
        if table.tenant_id in tenant_ids and table.valid_from <= at:
            out[("tenant", table.tenant_id)] = table
    return out


def table_prices(*, table_ids: set[int]) -> dict[tuple[int, int | None], Prices]:
    """Prices of these tables for every GPU SKU any of them prices (0 and unpriced where one does
    not), and for a CPU run (SKU None), keyed (table, SKU), in two queries."""
    tables = list(PricingTable.objects.filter(pk__in=table_ids))
    rates = {
        (p, s): r
        for p, s, r in GpuPrice.objects.filter(pricing_table_id__in=table_ids).values_list(
            "pricing_table_id", "sku_id", "hourly_usd"
        )
    }
    skus = {None} | {s for _, s in rates}
    return {
        (t.pk, sku): Prices.from_table(
            t, gpu_hour_usd=rates.get((t.pk, sku), None if sku is not None else 0)
        )
        for t in tables
        for sku in skus
    }
