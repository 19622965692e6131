"""Writes on pricing tables and cost models (staff only; the admin and the API call these)."""

from __future__ import annotations

import re
from decimal import Decimal

from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.pricing.models import CostModel, GpuPrice, PricingTable
from apps.tenants.models import Tenant

# What a table prices with: an edit of one of these on a table in force makes a new version.
PRICE_FIELDS = (
    "currency",
    "electricity_usd_per_kwh",
    "pue",
    "vcpu_hour_usd",
    "memory_gb_hour_usd",
    "carbon_g_per_kwh",
    "carbon_region",
)
# A pricing table's own fields, as the API edits them and a new version starts from.
PRICING_TABLE_FIELDS = ("name", "valid_from", *PRICE_FIELDS, "is_example", "notes")


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


def refuse_unpriced_skus(
    *, priced: set[int], in_use: dict[int, tuple[str, int]], confirm: bool
) -> None:
    """A table must price what it claims: one that leaves a SKU of running or recent runs
    (`in_use`: {SKU id: (name, runs)}) without a rate is refused, naming the SKUs, unless the
    staff user confirms (their GPU time is then billed as unpriced, never as $0)."""
    missing = sorted((name, runs) for sku, (name, runs) in in_use.items() if sku not in priced)
    if missing and not confirm:
        named = ", ".join(f"{name} ({runs} running or recent runs)" for name, runs in missing)
        raise ApplicationError(
            f"gpu_prices: no price for {named}; add a price, or confirm (confirm_unpriced: true) "
            "to leave their GPU time unpriced under this table",
            {"fields": {"gpu_prices": ["unpriced sku"]}, "unpriced_skus": [n for n, _ in missing]},
            code="unpriced",
            status=409,
        )


@transaction.atomic
def pricing_table_create(
    *,
    tenant: Tenant,
    gpu_prices: list[dict] | None = None,
    skus_in_use: dict[int, tuple[str, int]] | None = None,
    confirm_unpriced: bool = False,
    **fields,
) -> PricingTable:
    refuse_unpriced_skus(
        priced={p["sku"].pk for p in gpu_prices or []},
        in_use=skus_in_use or {},
        confirm=confirm_unpriced,
    )
    table = PricingTable(tenant=tenant, **fields)
    _unique(table, "valid_from", "a pricing table")
    table.full_clean()
    table.save()
    _gpu_prices_replace(table=table, gpu_prices=gpu_prices or [])
    return table


def gpu_rates(table: PricingTable) -> dict[int, Decimal]:
    return dict(table.gpu_prices.values_list("sku_id", "hourly_usd"))


def _rates_set(table: PricingTable, rates: dict[int, Decimal]) -> None:
    table.gpu_prices.all().delete()
    GpuPrice.objects.bulk_create(
        [GpuPrice(pricing_table=table, sku_id=sku, hourly_usd=usd) for sku, usd in rates.items()]
    )


_EDIT_THE_NEWER = "edit that version; this one keeps the prices it priced with"


def _refuse_superseded(table: PricingTable, *, then: str) -> None:
    newer = table.superseded_by.order_by("valid_from").first()
    if newer is not None:
        raise ApplicationError(
            f"pricing table {table.pk}: superseded by version {newer.pk} from "
            f"{newer.valid_from:%Y-%m-%d %H:%M:%S} UTC; {then}",
            {"superseded_by": newer.pk},
            code="superseded",
            status=409,
        )


@transaction.atomic
def pricing_table_update(
    *,
    table: PricingTable,
    gpu_prices: list[dict] | None = None,
    skus_in_use: dict[int, tuple[str, int]] | None = None,
    confirm_unpriced: bool = False,
    **fields,
) -> PricingTable:
    """Edit a table; `gpu_prices`, when given, replaces the table's GPU prices. Returns the
    table as edited: `table` itself, or the new version.

    Prices in force are immutable, so nothing priced with them ever moves: a price edit of a
    table already in force makes a new version from now (`supersedes` = the table; names and
    notes as edited, else a name of its own and no example flag: _version_identity), and the
    table keeps its prices for the time before. Windows, bills and
    comparisons refer to the version they priced with. A table not yet in force, or an edit of
    names and notes only, is edited in place. A superseded table is not edited again (409).
    """
    now = timezone.now()
    stored = PricingTable.objects.select_for_update().get(pk=table.pk)
    priced = any(name in fields and getattr(stored, name) != fields[name] for name in PRICE_FIELDS)
    if gpu_prices is not None:
        new_rates = {p["sku"].pk: Decimal(p["hourly_usd"]) for p in gpu_prices}
        old_rates = gpu_rates(stored)
        priced = priced or new_rates != old_rates
        dropped = {sku: use for sku, use in (skus_in_use or {}).items() if sku in old_rates}
        refuse_unpriced_skus(priced=set(new_rates), in_use=dropped, confirm=confirm_unpriced)
    in_force = stored.valid_from <= now
    if in_force and "valid_from" in fields and fields["valid_from"] != stored.valid_from:
        raise ApplicationError(
            "valid_from: a table in force keeps its start; a price edit takes effect from now",
            {"fields": {"valid_from": ["in force"]}},
            code="invalid",
            status=409,
        )
    if in_force and priced:
        _refuse_superseded(stored, then=_EDIT_THE_NEWER)
        values = {name: getattr(stored, name) for name in PRICING_TABLE_FIELDS} | fields
        version = PricingTable(tenant_id=stored.tenant_id, supersedes=stored, **values)
        version.valid_from = now
        _version_identity(version, stored)
        return _version_save(version, gpu_prices=gpu_prices, rates=gpu_rates(stored))
    for name, value in fields.items():
        setattr(table, name, value)
    _unique(table, "valid_from", "a pricing table")
    table.full_clean()
    table.save()
    if gpu_prices is not None:
        _gpu_prices_replace(table=table, gpu_prices=gpu_prices)
    return table


def _version_save(
    version: PricingTable, *, gpu_prices: list[dict] | None, rates: dict[int, Decimal]
) -> PricingTable:
    """Save a new version: its GPU prices the edit's, else the superseded table's."""
    _unique(version, "valid_from", "a pricing table")
    version.full_clean()
    version.save()
    if gpu_prices is not None:
        _gpu_prices_replace(table=version, gpu_prices=gpu_prices)
    else:
        _rates_set(version, rates)
    return version


def _version_identity(version: PricingTable, stored: PricingTable) -> None:
    """A new version's name and example flag, where the edit left the old table's: a name of its
    own (the old one's, numbered: 'AWS us-east v2'; 'Example prices' becomes 'Prices v2') and
    no example flag, since prices someone edited are theirs, not the seeded example's."""
    if version.name == stored.name:
        base = re.sub(r"\s+v\d+$", "", stored.name)
        if stored.is_example and base.lower().startswith("example "):
            base = base[len("example ") :].capitalize()
        number, older = 2, stored.supersedes
        while older is not None:
            number, older = number + 1, older.supersedes
        version.name = f"{base} v{number}"[: PricingTable._meta.get_field("name").max_length]
    if stored.is_example and version.is_example:
        version.is_example = False


def pricing_table_version_split(
    *, table: PricingTable, stored: PricingTable, stored_rates: dict[int, Decimal]
) -> PricingTable:
    """The admin's path to the same end: its form has already saved a price edit in place.
    What the table holds now becomes a new version from now, and the table gets back what it
    held (`stored`, `stored_rates`), so what was priced with it stays as it was."""
    _refuse_superseded(stored, then=_EDIT_THE_NEWER)
    version = PricingTable.objects.get(pk=table.pk)
    edited_rates = gpu_rates(version)
    version.pk = version.id = None
    version.supersedes_id, version.valid_from = stored.pk, timezone.now()
    _version_identity(version, stored)
    for name in PRICING_TABLE_FIELDS:
        setattr(table, name, getattr(stored, name))
    table.save()
    _rates_set(table, stored_rates)
    return _version_save(version, gpu_prices=None, rates=edited_rates)


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
    _refuse_superseded(table, then="delete that version first (it was made from this one)")
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
