"""Writes on pricing tables and cost models (staff only; the admin and the API call these)."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.pricing.models import CostModel, GpuPrice, PricingTable
from apps.tenants.models import Tenant

# A pricing table's own fields, as the API edits them and a superseded copy keeps them.
PRICING_TABLE_FIELDS = (
    "name",
    "currency",
    "valid_from",
    "electricity_usd_per_kwh",
    "pue",
    "vcpu_hour_usd",
    "memory_gb_hour_usd",
    "is_example",
    "notes",
)


def _unique(obj, field: str, label: str) -> None:
    """The tenant-wide uniqueness of `field`, refused with the field named
    (before the constraint fires)."""
    value = getattr(obj, field)
    if (
        type(obj)
        .objects.filter(tenant_id=obj.tenant_id, **{field: value})
        .exclude(pk=obj.pk)
        .exists()
    ):
        raise ApplicationError(
            f"{field}: the tenant already has {label} with {field} {value}",
            {"fields": {field: ["already exists"]}},
            code="invalid",
            status=409,
        )


def _gpu_prices_replace(*, table: PricingTable, gpu_prices: list[dict]) -> None:
    skus = [p["sku"].pk for p in gpu_prices]
    if len(skus) != len(set(skus)):
        raise ApplicationError(
            "gpu_prices: each SKU at most once per table",
            {"fields": {"gpu_prices": ["duplicate sku"]}},
            code="invalid",
        )
    table.gpu_prices.all().delete()
    rows = [
        GpuPrice(pricing_table=table, sku=p["sku"], hourly_usd=p["hourly_usd"]) for p in gpu_prices
    ]
    for row in rows:
        row.full_clean(exclude=["pricing_table"])
    GpuPrice.objects.bulk_create(rows)


@transaction.atomic
def pricing_table_create(
    *, tenant: Tenant, gpu_prices: list[dict] | None = None, **fields
) -> PricingTable:
    table = PricingTable(tenant=tenant, **fields)
    _unique(table, "valid_from", "a pricing table")
    table.full_clean()
    table.save()
    _gpu_prices_replace(table=table, gpu_prices=gpu_prices or [])
    return table


# What a table prices with: an edit of one of these on a table in force starts a new version.
PRICE_FIELDS = ("currency", "electricity_usd_per_kwh", "pue", "vcpu_hour_usd", "memory_gb_hour_usd")


@transaction.atomic
def pricing_table_update(
    *, table: PricingTable, gpu_prices: list[dict] | None = None, **fields
) -> PricingTable:
    """Edit a table; `gpu_prices`, when given, replaces the table's GPU prices.

    History is never rewritten: a price edit of a table already in force takes effect from now.
    The table moves to valid_from = now with its new prices, and a copy with the old prices
    keeps its old valid_from for the time before (pricing_table_version_keep). Names and notes
    are edited in place.
    """
    now = timezone.now()
    priced = any(name in fields and getattr(table, name) != fields[name] for name in PRICE_FIELDS)
    if gpu_prices is not None:
        new_rates = {p["sku"].pk: Decimal(p["hourly_usd"]) for p in gpu_prices}
        priced = priced or new_rates != dict(table.gpu_prices.values_list("sku_id", "hourly_usd"))
    in_force = table.pk is not None and table.valid_from <= now
    if in_force and "valid_from" in fields and fields["valid_from"] != table.valid_from:
        raise ApplicationError(
            "valid_from: a table in force keeps its start; a price edit takes effect from now",
            {"fields": {"valid_from": ["in force"]}},
            code="invalid",
            status=409,
        )
    if in_force and priced:
        pricing_table_version_keep(table=table, until=now)
        fields["valid_from"] = now
    for name, value in fields.items():
        setattr(table, name, value)
    _unique(table, "valid_from", "a pricing table")
    table.full_clean()
    table.save()
    if gpu_prices is not None:
        _gpu_prices_replace(table=table, gpu_prices=gpu_prices)
    return table


def pricing_table_version_keep(
    *, table: PricingTable, until, stored: PricingTable | None = None
) -> PricingTable:
    """Keep a table's prices as stored, for the time before `until`: a copy at its valid_from,
    GPU prices too.

    The table itself then moves to `until` (the caller saves it), so the copy takes its place in
    the schedule: intervals before `until` are billed, and re-billed, as they were. `stored`: the
    table as it was, when the caller has already saved an edit of it (the admin).
    """
    stored = stored or PricingTable.objects.get(pk=table.pk)
    rates = list(stored.gpu_prices.values_list("sku_id", "hourly_usd"))
    PricingTable.objects.filter(pk=table.pk).update(
        valid_from=until
    )  # frees (tenant, valid_from) for the copy
    table.valid_from = until
    copy = PricingTable.objects.get(pk=table.pk)
    copy.pk = copy.id = None
    for name in PRICING_TABLE_FIELDS:
        setattr(copy, name, getattr(stored, name))
    copy.name = f"{stored.name} (until {until:%Y-%m-%d %H:%M} UTC)"[:120]
    copy.save()
    GpuPrice.objects.bulk_create(
        [GpuPrice(pricing_table=copy, sku_id=sku, hourly_usd=usd) for sku, usd in rates]
    )
    return copy


def _delete_unless_used(obj, label: str) -> None:
    try:
        with transaction.atomic():
            obj.delete()
    except ProtectedError as exc:
        used = len(exc.protected_objects)
        raise ApplicationError(
            f"{label} is used by {used} experiments; point them elsewhere first",
            {"experiments": used},
            code="in_use",
            status=409,
        ) from None


def pricing_table_delete(*, table: PricingTable) -> None:
    _delete_unless_used(table, f"pricing table '{table.name}'")


@transaction.atomic
def cost_model_create(*, tenant: Tenant, **fields) -> CostModel:
    model = CostModel(tenant=tenant, **fields)
    _unique(model, "name", "a cost model")
    model.full_clean()
    model.save()
    return model


@transaction.atomic
def cost_model_update(*, cost_model: CostModel, **fields) -> CostModel:
    for name, value in fields.items():
        setattr(cost_model, name, value)
    _unique(cost_model, "name", "a cost model")
    cost_model.full_clean()
    cost_model.save()
    return cost_model


def cost_model_delete(*, cost_model: CostModel) -> None:
    _delete_unless_used(cost_model, f"cost model '{cost_model.name}'")
