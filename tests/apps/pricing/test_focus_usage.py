"""What a FOCUS import keeps for billing's reconciliation (FocusUsage): each counted row's
EffectiveCost and hours per ResourceId and UTC day, split across midnight by time, the same from
CSV and Parquet, and the rows it could not place counted."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest

from apps.pricing.focus import pricing_table_import_focus
from apps.pricing.models import FocusUsage
from tests.apps.pricing.focus_files import aws, to_csv, to_parquet
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def kept(tenant, data: bytes) -> tuple[dict, dict]:
    outcome = pricing_table_import_focus(tenant=tenant, stream=io.BytesIO(data))
    usage = {
        (u.resource_id, u.day.isoformat()): (u.hours, u.effective_cost)
        for u in FocusUsage.objects.filter(focus_import=outcome.record)
    }
    return usage, outcome.record.derived["usage"]


def rows() -> list[dict]:
    def row(resource, start, end, hours, cost):
        return aws(
            "p5.48xlarge",
            hours=hours,
            effective=cost,
            ResourceId=resource,
            ChargePeriodStart=start,
            ChargePeriodEnd=end,
        )

    return [
        # 21:00 to 03:00: a quarter, 3 hours, on the 14th, three quarters on the 15th
        row("i-1", "2026-05-14T21:00:00Z", "2026-05-15T05:00:00Z", 8, "100.000001"),
        row("i-2", "2026-05-14 10:00:00", "2026-05-14 11:00:00", 1, "55.2"),  # no zone: UTC
        row("i-3", "2026-05-16T01:00:00+02:00", "2026-05-16T02:00:00+02:00", 1, "55.2"),
        row("", "2026-05-17T00:00:00Z", "2026-05-17T01:00:00Z", 1, "55.2"),  # no ResourceId
        row("i-4", "2026-05-18T00:00:00Z", "2027-05-18T00:00:00Z", 2, "110.4"),  # a year: one day
        row("i-5", "yesterday", "today", 1, "55.2"),  # priced, on no day
    ]


@pytest.mark.parametrize("encode", [to_csv, to_parquet])
def test_the_usage_kept_per_resource_and_utc_day(encode):
    usage, counted = kept(TenantFactory(), encode(rows()))
    assert usage == {
        ("i-1", "2026-05-14"): (Decimal(3), Decimal("37.5000003750")),
        ("i-1", "2026-05-15"): (Decimal(5), Decimal("62.5000006250")),
        ("i-2", "2026-05-14"): (Decimal(1), Decimal("55.2")),
        ("i-3", "2026-05-15"): (Decimal(1), Decimal("55.2")),  # 23:00 UTC
        ("", "2026-05-17"): (Decimal(1), Decimal("55.2")),
        ("i-4", "2026-05-18"): (Decimal(2), Decimal("110.4")),
    }
    assert counted == {
        "records": 6,
        "rows_without_resource_id": 1,
        "rows_without_charge_period": 1,
    }
