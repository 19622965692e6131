"""A bill that reconciles (apps.billing.reconcile): an invoice built from known runs is matched per
resource and UTC day; every run's hours are attributed, idle is the invoice's exactly, runs with
no invoice row are unmatched, and where the runs were priced at the import's effective prices the
difference is within 0.5 %."""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import date
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.billing.focus_export import focus_csv, focus_rows
from apps.billing.reconcile import (
    IDLE,
    MATCHED,
    UNMATCHED,
    UNRECORDED,
    reconciliation,
    reconciliation_csv,
)
from apps.billing.services import run_reprice
from apps.core.exceptions import ApplicationError
from apps.pricing import focus
from apps.pricing.focus import pricing_table_import_focus
from apps.pricing.models import FocusImport, FocusUsage
from tests.apps.billing.reconcile_world import (
    ARN,
    M7I_HOUR,
    P5_HOUR,
    at,
    invoice_rows,
    invoiced_month,
)
from tests.apps.billing.test_focus_export import trained
from tests.apps.pricing.focus_files import to_csv
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def month():
    return invoiced_month()


def by_key(found) -> dict[tuple[str, date], object]:
    return {(r.resource_id, r.day): r for r in found.rows}


def test_the_import_keeps_the_invoices_cost_and_hours_per_resource_and_day(month):
    record = month.outcome.record
    assert record.usage_stored
    assert record.derived["usage"] == {
        "records": 6,  # i-0bbb's row across midnight is on two days
        "rows_without_resource_id": 0,
        "rows_without_charge_period": 0,
    }
    kept = {
        (u.resource_id, u.day.isoformat()): (u.hours, u.gpu_hours, u.vcpu_hours, u.effective_cost)
        for u in FocusUsage.objects.filter(focus_import=record)
    }
    assert kept[(f"{ARN}i-0aaa", "2026-05-14")] == (3, 24, 576, 3 * P5_HOUR)
    # 22:00 to 02:00: two hours on each day, the cost split by time
    assert kept[("i-0bbb", "2026-05-15")] == (2, 16, 384, 2 * P5_HOUR)
    assert kept[("i-0bbb", "2026-05-16")] == (2, 16, 384, 2 * P5_HOUR)
    assert kept[("i-0idle", "2026-05-25")] == (24, 192, 4608, Decimal("1324.80"))
    assert kept[("i-0cpu", "2026-05-23")] == (1, 0, 8, M7I_HOUR)


def test_every_runs_hours_are_attributed_idle_is_exact_and_the_difference_within_half_a_percent(
    month,
):
    runs = month.runs
    found = reconciliation(tenant=month.tenant, period="2026-05")
    assert found.record == month.outcome.record
    rows = by_key(found)
    aaa = rows[(f"{ARN}i-0aaa", date(2026, 5, 14))]  # the run's instance id matched the ARN
    assert aaa.status == MATCHED and aaa.run_resource_ids == {"i-0aaa"}
    assert (aaa.unit, aaa.billed_hours, aaa.used_hours) == ("GPU-hours", 24, 16)
    assert aaa.attributed_usd == runs["aaa"].cost_usd
    assert aaa.invoice_same_usd == Decimal("110.400000")  # 16 of the 24 GPU-hours billed
    assert aaa.idle_usd == P5_HOUR and aaa.idle_hours == 8  # the hour no run used
    # the run across midnight: an hour on each day, each against two billed hours
    for day in (15, 16):
        bbb = rows[("i-0bbb", date(2026, 5, day))]
        assert (bbb.status, bbb.runs, bbb.used_hours, bbb.billed_hours) == (MATCHED, 1, 8, 16)
        assert bbb.idle_usd == P5_HOUR
    assert sum(rows[("i-0bbb", date(2026, 5, d))].attributed_usd for d in (15, 16)) == (
        runs["bbb"].cost_usd
    )
    ccc = rows[("i-0ccc", date(2026, 5, 20))]  # two runs of 4 GPUs fill the instance's hour
    assert (ccc.runs, ccc.used_hours, ccc.billed_hours, ccc.idle_usd) == (2, 8, 8, 0)
    cpu = rows[("i-0cpu", date(2026, 5, 23))]
    assert (cpu.unit, cpu.used_hours, cpu.billed_hours, cpu.idle_usd) == ("vCPU-hours", 8, 8, 0)
    idle = rows[("i-0idle", date(2026, 5, 25))]
    assert (idle.status, idle.runs, idle.idle_usd) == (IDLE, 0, Decimal("1324.80"))
    ddd = rows[("i-0ddd", date(2026, 5, 21))]
    assert (ddd.status, ddd.unmatched_usd, ddd.used_hours) == (
        UNMATCHED,
        runs["ddd"].cost_usd,
        8,
    )
    none = rows[("", date(2026, 5, 22))]
    assert (none.status, none.unmatched_usd) == (UNRECORDED, runs["none"].cost_usd)

    # every run's GPU- or vCPU-hours and bill are attributed, once
    gpu_hours = sum(Decimal(str(r.device_seconds / 3600)) for r in runs.values() if r.gpu_count)
    assert sum(r.run_gpu_hours for r in found.rows) == gpu_hours == 16 + 16 + 8 + 8 + 0.5
    assert sum(r.run_vcpu_hours for r in found.rows) == 8
    assert sum(r.attributed_usd for r in found.rows) == sum(r.cost_usd for r in runs.values())
    for row in found.rows:
        if row.status == MATCHED:
            assert abs(row.difference_usd) <= row.invoice_same_usd * Decimal("0.005"), row
            assert row.unmatched_usd == 0  # no run used more hours than billed

    totals = found.totals()
    assert totals["invoice_usd"] == (3 + 4 + 1 + 24) * P5_HOUR + M7I_HOUR
    assert totals["idle_usd"] == (1 + 2 + 24) * P5_HOUR
    assert totals["invoice_same_hours_usd"] == (2 + 2 + 1) * P5_HOUR + M7I_HOUR
    assert totals["invoice_same_hours_usd"] + totals["idle_usd"] == totals["invoice_usd"]
    assert totals["costlab_usd"] == sum(r.cost_usd for r in runs.values())
    assert totals["costlab_same_hours_usd"] + totals["unmatched_usd"] == totals["costlab_usd"]
    assert totals["unmatched"] == {
        "no_invoice_row_usd": runs["ddd"].cost_usd,
        "no_resource_recorded_usd": runs["none"].cost_usd,
        "beyond_invoice_hours_usd": 0,
    }
    assert abs(totals["difference_pct"]) < Decimal("0.5")
    assert (
        totals["resource_days"],
        totals["resource_days_matched"],
        totals["resource_days_idle"],
        totals["resource_days_unmatched"],
    ) == (8, 5, 1, 2)
    assert [i["resource_id"] for i in found.idle_by_resource()] == [
        "i-0idle",
        "i-0bbb",
        f"{ARN}i-0aaa",
    ]
    assert found.idle_by_resource()[1]["usd"] == 2 * P5_HOUR  # two days of an idle hour each


def test_costlabs_side_is_the_focus_exports_split(month):
    """The runs' bill per resource and day is the FOCUS export's, which names the run's resource."""
    exported: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for row in focus_rows(tenant=month.tenant, period="2026-05"):
        exported[(row["ResourceId"], row["ChargePeriodStart"][:10])] += Decimal(
            row["EffectiveCost"]
        )
    found = reconciliation(tenant=month.tenant, period="2026-05")
    ours: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for row in found.rows:
        if row.runs:
            (resource,) = row.run_resource_ids
            ours[(resource or f"costlab-run-{month.runs['none'].pk}", row.day.isoformat())] += (
                row.attributed_usd
            )
    assert ours == exported


def test_reconciling_costlabs_own_export_finds_no_difference(month):
    """costlab's FOCUS export imported as the invoice: every run-day matches itself, at the same
    cost for the same hours."""
    text = "".join(focus_csv(tenant=month.tenant, period="2026-05"))
    mirror = pricing_table_import_focus(tenant=month.tenant, stream=io.BytesIO(text.encode()))
    found = reconciliation(tenant=month.tenant, period="2026-05", focus_import=mirror.record.pk)
    totals = found.totals()
    none = month.runs["none"]
    assert totals["difference_usd"] == 0 and totals["unmatched"]["beyond_invoice_hours_usd"] == 0
    # the run that recorded no resource is exported as costlab-run-<id>, which no run records
    assert totals["idle_usd"] == none.cost_usd
    assert totals["unmatched_usd"] == totals["unmatched"]["no_resource_recorded_usd"]
    assert totals["unmatched_usd"] == none.cost_usd


def test_the_import_writes_its_sums_in_batches_and_they_read_back_whole(month, monkeypatch):
    """Memory stays flat: a sum held past USAGE_HELD keys is written, and read back summed."""
    monkeypatch.setattr(focus, "USAGE_HELD", 1)
    tenant = TenantFactory(slug="batched")
    aaa_10, aaa_11, aaa_12, bbb, *rest = invoice_rows()
    rows = [aaa_10, bbb, aaa_11, *rest, aaa_12]  # i-0aaa's hours between other resources'
    pricing_table_import_focus(tenant=tenant, stream=io.BytesIO(to_csv(rows)))
    record = FocusImport.objects.get(tenant=tenant)
    aaa = FocusUsage.objects.filter(focus_import=record, resource_id=f"{ARN}i-0aaa")
    assert aaa.count() == 3  # the same resource-day written three times
    assert sum(u.effective_cost for u in aaa) == 3 * P5_HOUR
    month_rows = by_key(reconciliation(tenant=month.tenant, period="2026-05"))
    FocusImport.objects.filter(pk=record.pk).update(tenant=month.tenant)
    batched = by_key(reconciliation(tenant=month.tenant, period="2026-05", focus_import=record.pk))
    assert {k: r.shown() for k, r in batched.items()} == {
        k: r.shown() for k, r in month_rows.items()
    }


def test_the_queries_do_not_grow_with_the_runs_within_a_day(month):
    """Fixed queries for the import, the invoice and the runs within a day; two reads (its price
    schedule, its samples) per run across midnight, as the FOCUS export splits it."""
    with CaptureQueriesContext(connection) as few:
        reconciliation(tenant=month.tenant, period="2026-05")
    assert len(few) == 5 + 2  # run "bbb" is across midnight
    for name in ("aaa", "ccc1", "cpu"):  # more runs within a day: no more queries
        run = month.runs[name]
        run.pk = None
        run.run_key = f"again-{name}"
        run.save()
    with CaptureQueriesContext(connection) as more:
        reconciliation(tenant=month.tenant, period="2026-05")
    assert len(more) == len(few)
    bbb = month.runs["bbb"]
    trained(
        bbb.arm,
        start=at(27, 23),
        minutes=90,
        resource_id="i-0bbb",
        gpu_count=8,
        gpu_sku=bbb.gpu_sku,
        power_w=5600.0,
    )
    with CaptureQueriesContext(connection) as across:
        found = reconciliation(tenant=month.tenant, period="2026-05")
    assert len(across) == len(few) + 2
    assert {r.day.day for r in found.rows if r.resource_id == "i-0bbb"} == {15, 16, 27, 28}


def test_the_csv_has_every_resource_day(month):
    found = reconciliation(tenant=month.tenant, period="2026-05")
    lines = "".join(reconciliation_csv(found)).splitlines()
    assert lines[0].startswith("resource_id,day,status,")
    assert len(lines) == 1 + len(found.rows) == 9


def test_a_period_with_no_import_or_written_otherwise_is_refused_naming_period(month):
    with pytest.raises(ApplicationError) as missing:
        reconciliation(tenant=month.tenant, period="2026-04")
    assert missing.value.message.startswith("period: no FOCUS import of team 'lab' bills")
    assert missing.value.extra["fields"] == {"period": ["no invoice imported for 2026-04"]}
    assert missing.value.status_code == 404
    with pytest.raises(ApplicationError) as bad:
        reconciliation(tenant=month.tenant, period="May 2026")
    assert bad.value.message == "period: 'May 2026' is not a month written YYYY-MM"
    assert bad.value.status_code == 400
    other = TenantFactory(slug="other")
    with pytest.raises(ApplicationError) as foreign:
        reconciliation(tenant=other, period="2026-05", focus_import=month.outcome.record.pk)
    assert foreign.value.message.startswith("focus_import: no FOCUS import")
    FocusImport.objects.filter(pk=month.outcome.record.pk).update(usage_stored=False)
    with pytest.raises(ApplicationError) as old:
        reconciliation(tenant=month.tenant, period="2026-05", focus_import=month.outcome.record.pk)
    assert "before costlab kept an invoice's usage" in old.value.message


def test_a_run_billed_at_other_prices_than_the_invoices_shows_the_difference(month):
    """The run on i-0aaa billed at the older table (4.00 a GPU-hour, electricity 0.10 a kWh):
    its difference is its bill minus the invoice's cost of its 16 GPU-hours."""
    older = month.tenant.pricing_tables.order_by("valid_from").first()
    aaa = month.runs["aaa"]
    run_reprice(run_id=aaa.pk, actor=None, reason="the list prices", pricing_table=older)
    aaa.refresh_from_db()
    found = reconciliation(tenant=month.tenant, period="2026-05")
    [biggest] = found.biggest_differences()
    assert biggest.resource_id == f"{ARN}i-0aaa" and biggest.attributed_usd == aaa.cost_usd
    assert biggest.difference_usd == aaa.cost_usd - Decimal("110.40") < 0
    assert biggest.difference_pct == (
        (aaa.cost_usd - Decimal("110.40")) / Decimal("110.40") * 100
    ).quantize(Decimal("0.0001"))
    assert biggest.idle_usd == P5_HOUR  # the same hours: idle does not move with costlab's prices
    assert found.totals()["difference_usd"] == biggest.difference_usd
