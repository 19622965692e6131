"""costlab's allocation as FOCUS 1.2 (apps.billing.focus_export): one row per run and UTC day, the
day's share of the run's bill by its telemetry, and a round trip through the FOCUS import."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from apps.billing.focus_export import COLUMNS, focus_csv, focus_rows
from apps.billing.services import run_reprice, telemetry_ingest
from apps.experiments.models import Run
from apps.pricing.focus import MANDATORY, pricing_table_import_focus
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    GpuPriceFactory,
    GpuSkuFactory,
    PricingTableFactory,
    RunFactory,
    TenantFactory,
)
from tests.helpers import installed_tool

pytestmark = pytest.mark.django_db

MIDNIGHT = datetime(2026, 5, 15, tzinfo=UTC)
MONTH_END = datetime(2026, 6, 1, tzinfo=UTC)


def trained(arm, *, start, minutes, power_w, **fields) -> Run:
    """A finished external run with a sample a minute from `start`, billed by ingest."""
    run = RunFactory(
        arm=arm, kind="external", status="running", created=start - timedelta(minutes=5), **fields
    )
    samples = [
        {
            "seq": i,
            "ts": (start + timedelta(minutes=i)).isoformat(),
            "step": i,
            "tokens": 1000 * i,
            "util_pct": 90.0,
            "power_w": power_w,
            "energy_j": power_w * 60.0 * i,
        }
        for i in range(minutes + 1)
    ]
    telemetry_ingest(run_id=run.pk, samples=samples)
    Run.objects.filter(pk=run.pk).update(
        status="succeeded", finished_at=start + timedelta(minutes=minutes)
    )
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def month():
    """A tenant's May: an H100 run across midnight, a CPU run, an A100 run across the month's
    end."""
    tenant = TenantFactory(slug="lab", name="The Lab")
    table = PricingTableFactory(
        tenant=tenant,
        valid_from=datetime(2026, 1, 1, tzinfo=UTC),
        electricity_usd_per_kwh=Decimal("0.10"),
        vcpu_hour_usd=Decimal("0.05"),
    )
    h100 = GpuSkuFactory(name="NVIDIA H100 SXM 80GB", tdp_w=700)
    a100 = GpuSkuFactory(name="NVIDIA A100 SXM 80GB", tdp_w=400)
    GpuPriceFactory(pricing_table=table, sku=h100, hourly_usd=Decimal("4.00"))
    GpuPriceFactory(pricing_table=table, sku=a100, hourly_usd=Decimal("2.00"))
    experiment = ExperimentFactory(tenant=tenant, name="batching", status="active")
    control = ArmFactory(experiment=experiment, name="control", is_control=True)
    candidate = ArmFactory(experiment=experiment, name="candidate")
    gpu = trained(
        control,
        start=MIDNIGHT - timedelta(hours=1),
        minutes=120,
        power_w=1400.0,
        gpu_sku=h100,
        gpu_count=2,
        host="gpu-node-3",
        device="cuda:0 NVIDIA H100 x2",
    )
    cpu = trained(
        candidate, start=datetime(2026, 5, 20, 10, tzinfo=UTC), minutes=60, power_w=90.0, vcpus=8
    )
    late = trained(
        candidate,
        start=MONTH_END - timedelta(minutes=30),
        minutes=60,
        power_w=400.0,
        gpu_sku=a100,
        gpu_count=1,
    )
    return tenant, gpu, cpu, late


def rows_of(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_the_export_has_focus_1_2s_columns_and_a_row_per_run_and_day(month):
    tenant, gpu, cpu, late = month
    text = "".join(focus_csv(tenant=tenant, period="2026-05"))
    header = text.splitlines()[0].split(",")
    assert header == list(COLUMNS)
    assert set(MANDATORY["1.2"]) <= set(header)
    focus_columns = {c for c in header if not c.startswith("x_")}
    assert all(c[0].isupper() for c in focus_columns)  # the rest is x_-prefixed
    rows = rows_of(text)
    assert [(r["x_CostlabRunId"], r["ChargePeriodStart"]) for r in rows] == [
        (str(gpu.pk), "2026-05-14T00:00:00Z"),
        (str(gpu.pk), "2026-05-15T00:00:00Z"),
        (str(cpu.pk), "2026-05-20T00:00:00Z"),
        (str(late.pk), "2026-05-31T00:00:00Z"),
    ]
    first = rows[0]
    assert first["ChargeCategory"] == "Usage" and first["ChargePeriodEnd"] == "2026-05-15T00:00:00Z"
    assert first["BillingPeriodStart"] == "2026-05-01T00:00:00Z"
    assert first["BillingPeriodEnd"] == "2026-06-01T00:00:00Z"
    assert first["BillingAccountId"] == "costlab:lab" and first["BillingCurrency"] == "USD"
    assert {r["InvoiceId"] for r in rows} == {"costlab:lab:2026-05"}  # the month's statement
    assert first["ResourceId"] == "gpu-node-3/cuda:0 NVIDIA H100 x2"
    assert rows[2]["ResourceId"] == f"costlab-run-{cpu.pk}"  # no host recorded
    assert json.loads(first["Tags"]) == {
        "experiment": "batching",
        "arm": "control",
        "run": str(gpu.pk),
    }
    assert first["PricingUnit"] == "Hours" and first["x_CostlabResource"] == "gpu-hours"
    assert json.loads(first["SkuPriceDetails"]) == {"GpuCount": 1, "x_GpuSku": gpu.gpu_sku.name}
    assert rows[2]["x_CostlabResource"] == "vcpu-hours"
    assert all(r["x_CostlabSplit"] == "telemetry" for r in rows)


def test_a_run_across_midnight_is_split_by_its_telemetry_and_the_days_add_up_to_its_bill(month):
    tenant, gpu, _cpu, late = month
    rows = [r for r in focus_rows(tenant=tenant, period="2026-05") if r["x_CostlabRunId"]]
    days = [r for r in rows if r["x_CostlabRunId"] == str(gpu.pk)]
    # an hour before midnight and an hour after, 2 GPUs: 2 GPU-hours a day, the same cost
    assert [r["PricingQuantity"] for r in days] == ["2.000000", "2.000000"]
    costs = [Decimal(r["EffectiveCost"]) for r in days]
    assert sum(costs) == gpu.cost_usd and abs(costs[0] - costs[1]) <= Decimal("0.000002")
    assert all(r["BilledCost"] == r["EffectiveCost"] == r["ListCost"] for r in days)
    # the run across the month's end: May has its first half hour, June the rest
    may = [r for r in rows if r["x_CostlabRunId"] == str(late.pk)]
    june = [r for r in focus_rows(tenant=tenant, period="2026-06")]
    assert [r["PricingQuantity"] for r in may + june] == ["0.500000", "0.500000"]
    assert Decimal(may[0]["EffectiveCost"]) + Decimal(june[0]["EffectiveCost"]) == late.cost_usd


def test_importing_costlabs_own_export_reproduces_its_totals(month):
    tenant, gpu, cpu, late = month
    text = "".join(focus_csv(tenant=tenant, period="2026-05")).encode()
    exported = rows_of(text.decode())
    outcome = pricing_table_import_focus(tenant=tenant, stream=io.BytesIO(text))
    assert outcome.created and not outcome.shown()["skipped"]
    assert outcome.table.name.startswith("from invoice costlab:lab:2026-05, period")
    derived = {t["instance_type"]: t for t in outcome.shown()["derived"]["instance_types"]}
    by_sku: dict[str, Decimal] = {}
    for r in exported:
        key = f"costlab:{r['x_CostlabGpuSku']}" if r["x_CostlabGpuSku"] else "costlab:vcpu"
        by_sku[key] = by_sku.get(key, Decimal("0")) + Decimal(r["EffectiveCost"])
    assert {k: Decimal(t["effective_cost"]) for k, t in derived.items()} == by_sku
    assert sum(by_sku.values()) == sum(Decimal(r["EffectiveCost"]) for r in exported)
    version = outcome.table
    rates = {p.sku.name: p.hourly_usd for p in version.gpu_prices.select_related("sku")}
    # the May rate times May's GPU-hours is May's cost, to the cent
    for key, t in derived.items():
        rate = rates[key.split(":", 1)[1]] if key != "costlab:vcpu" else version.vcpu_hour_usd
        assert abs(rate * Decimal(t["hours"]) - Decimal(t["effective_cost"])) < Decimal("0.01")
    # and the runs wholly in May, re-priced at the imported version, cost what they were billed
    for run in (gpu, cpu):
        reprice = run_reprice(run_id=run.pk, actor=None, reason="round trip", pricing_table=version)
        assert abs(reprice.cost_after_usd - reprice.cost_before_usd) < Decimal("0.01")
    # the export after the re-price still splits each run's (new) bill by its telemetry
    again = {r["x_CostlabRunId"]: r for r in focus_rows(tenant=tenant, period="2026-05")}
    assert Decimal(again[str(cpu.pk)]["EffectiveCost"]) == Run.objects.get(pk=cpu.pk).cost_usd


def test_a_month_is_written_yyyy_mm(month):
    tenant = month[0]
    with pytest.raises(ValueError, match="'2026-13' is not a month written YYYY-MM"):
        list(focus_csv(tenant=tenant, period="2026-13"))
    assert list(focus_rows(tenant=tenant, period="2026-04")) == []


FIND_PACKAGE = "import focus_validator as f, pathlib as p; print(p.Path(f.__file__).parents[1])"


@pytest.mark.slow  # starts the validator, a process of its own
def test_the_export_passes_the_finops_foundations_focus_validator(month, tmp_path):
    # The FinOps Foundation's focus-validator (PyPI `focus-validator`, 2.x: Python 3.12 or newer,
    # so in an environment of its own beside this project's 3.11: docs/billing.md says how).
    validator = installed_tool("COSTLAB_FOCUS_VALIDATOR", "focus-validator")
    if validator is None:
        pytest.skip("needs focus-validator 2.x (set COSTLAB_FOCUS_VALIDATOR; docs/billing.md)")
    tenant = month[0]
    exported = tmp_path / "costlab-2026-05.csv"
    exported.write_text("".join(focus_csv(tenant=tenant, period="2026-05")))
    # It reads its currency codes by a path relative to its package: it runs from there, with the
    # Python of its own environment (beside its script).
    package = subprocess.run(
        [str(validator.with_name("python")), "-c", FIND_PACKAGE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [str(validator), "--data-file", str(exported), "--validate-version", "1.2.0.1"]
        + ["--block-download"],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.splitlines()
    summary = [line for line in lines if line.startswith("Total:")]
    # A column's verdict is its root rule (`<Column>-C-000-…`, all its rules combined by AND and
    # OR: a failed branch of an OR that another branch satisfies fails no column), and the
    # dataset's own rules (`CostAndUsage-D-…`).
    failed = [line for line in lines if re.search(r"(-C-000-|CostAndUsage-D-)\S*: FAIL", line)]
    assert summary and not failed, (summary, failed, done.stderr[-2000:])
    assert re.search(r"Pass: [1-9]\d*", summary[0]), summary  # it checked something
