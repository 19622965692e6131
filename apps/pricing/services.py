"""Writes on pricing tables and cost models (staff only; the admin and the API call these)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import ProtectedError

from apps.core.exceptions import ApplicationError
from apps.pricing.models import CostModel, GpuPrice, PricingTable
from apps.tenants.models import Tenant


def _unique(obj, field: str, label: str) -> None:
    """The tenant-wide uniqueness of `field`, refused with the field named (before the constraint fires)."""
    value = getattr(obj, field)
    if type(obj).objects.filter(tenant_id=obj.tenant_id, **{field: value}).exclude(pk=obj.pk).exists():
        raise ApplicationError(f"{field}: the tenant already has {label} with {field} {value}",
                               {"fields": {field: ["already exists"]}}, code="invalid", status=409)


def _gpu_prices_replace(*, table: PricingTable, gpu_prices: list[dict]) -> None:
    skus = [p["sku"].pk for p in gpu_prices]
    if len(skus) != len(set(skus)):
        raise ApplicationError("gpu_prices: each SKU at most once per table",
                               {"fields": {"gpu_prices": ["duplicate sku"]}}, code="invalid")
    table.gpu_prices.all().delete()
    rows = [GpuPrice(pricing_table=table, sku=p["sku"], hourly_usd=p["hourly_usd"]) for p in gpu_prices]
    for row in rows:
        row.full_clean(exclude=["pricing_table"])
    GpuPrice.objects.bulk_create(rows)


@transaction.atomic
def pricing_table_create(*, tenant: Tenant, gpu_prices: list[dict] | None = None, **fields) -> PricingTable:
    table = PricingTable(tenant=tenant, **fields)
    _unique(table, "valid_from", "a pricing table")
    table.full_clean()
    table.save()
    _gpu_prices_replace(table=table, gpu_prices=gpu_prices or [])
    return table


@transaction.atomic
def pricing_table_update(*, table: PricingTable, gpu_prices: list[dict] | None = None, **fields) -> PricingTable:
    """Edit a table; `gpu_prices`, when given, replaces the table's GPU prices."""
    for name, value in fields.items():
        setattr(table, name, value)
    _unique(table, "valid_from", "a pricing table")
    table.full_clean()
    table.save()
    if gpu_prices is not None:
        _gpu_prices_replace(table=table, gpu_prices=gpu_prices)
    return table


def _delete_unless_used(obj, label: str) -> None:
    try:
        with transaction.atomic():
            obj.delete()
    except ProtectedError as exc:
        used = len(exc.protected_objects)
        raise ApplicationError(f"{label} is used by {used} experiments; point them elsewhere first",
                               {"experiments": used}, code="in_use", status=409) from None


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
