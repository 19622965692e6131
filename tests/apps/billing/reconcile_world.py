"""An invoice built from known runs, for the reconciliation's tests: a team's May 2026 of runs
with resource ids and telemetry, and an AWS FOCUS file whose rows bill those resources' hours at
one p5.48xlarge price (55.20 USD an instance-hour: 6.90 a GPU-hour) and one m7i.2xlarge price
(0.4032: 0.0504 a vCPU-hour), plus an idle resource and a run with no invoice row. The file is
imported, and the runs re-priced at the version it made, so costlab prices each hour as the
invoice does."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from apps.billing.services import run_reprice
from apps.experiments.models import Run
from apps.pricing.focus import ImportOutcome, pricing_table_import_focus
from apps.pricing.models import GpuSku
from tests.apps.billing.test_focus_export import trained
from tests.apps.pricing.focus_files import aws, to_csv
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    GpuPriceFactory,
    PricingTableFactory,
    TenantFactory,
)

H100 = "NVIDIA H100 SXM 80GB"
P5_HOUR = Decimal("55.20")  # an instance-hour of 8 H100s
M7I_HOUR = Decimal("0.4032")  # an instance-hour of 8 vCPUs
ARN = "arn:aws:ec2:us-east-1:123456789012:instance/"


def at(day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(2026, 5, day, hour, minute, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def billed(instance: str, resource: str, start: datetime, hours: int, hourly: Decimal) -> dict:
    """One AWS usage row billing `resource` for `hours` from `start`."""
    return aws(
        instance,
        hours=hours,
        effective=hourly * hours,
        ResourceId=resource,
        ChargePeriodStart=_iso(start),
        ChargePeriodEnd=_iso(start + timedelta(hours=hours)),
    )


@dataclass
class Month:
    tenant: object
    runs: dict[str, Run]
    outcome: ImportOutcome
    rows: list[dict]


def invoice_rows() -> list[dict]:
    p5, m7i = "p5.48xlarge", "m7i.2xlarge"
    return [
        # i-0aaa (the invoice names its ARN; the run its instance id): 10:00 to 13:00, hourly
        *(billed(p5, f"{ARN}i-0aaa", at(14, h), 1, P5_HOUR) for h in (10, 11, 12)),
        # i-0bbb: one row of 4 hours across midnight, 22:00 to 02:00
        billed(p5, "i-0bbb", at(15, 22), 4, P5_HOUR),
        # i-0ccc: one hour, two runs of 4 GPUs each on it
        billed(p5, "i-0ccc", at(20, 8), 1, P5_HOUR),
        # i-0idle: a whole day, no run
        billed(p5, "i-0idle", at(25), 24, P5_HOUR),
        # i-0cpu: a CPU instance, one hour
        billed(m7i, "i-0cpu", at(23, 10), 1, M7I_HOUR),
    ]


def invoiced_month(tenant=None) -> Month:
    tenant = tenant or TenantFactory(slug="lab", name="The Lab")
    table = PricingTableFactory(
        tenant=tenant,
        valid_from=datetime(2026, 1, 1, tzinfo=UTC),
        electricity_usd_per_kwh=Decimal("0.10"),
        vcpu_hour_usd=Decimal("0.05"),
    )
    h100, _ = GpuSku.objects.get_or_create(
        name=H100, defaults={"memory_gb": 80, "tdp_w": 700, "peak_bf16_tflops": Decimal("989")}
    )
    GpuPriceFactory(pricing_table=table, sku=h100, hourly_usd=Decimal("4.00"))
    experiment = ExperimentFactory(tenant=tenant, name="batching", status="active")
    arm = ArmFactory(experiment=experiment, name="control", is_control=True)
    gpu = {"gpu_sku": h100, "power_w": 5600.0}

    def run(resource: str, start: datetime, minutes: int, gpus: int = 8, **fields) -> Run:
        return trained(
            arm, start=start, minutes=minutes, resource_id=resource, gpu_count=gpus, **fields
        )

    runs = {
        "aaa": run("i-0aaa", at(14, 10), 120, **gpu),
        "bbb": run("i-0bbb", at(15, 23), 120, **gpu),  # across midnight
        "ccc1": run("i-0ccc", at(20, 8), 60, gpus=4, **gpu),
        "ccc2": run("i-0ccc", at(20, 8), 60, gpus=4, **gpu),
        "ddd": run("i-0ddd", at(21, 9), 60, **gpu),  # no invoice row
        "none": run("", at(22, 9), 30, gpus=1, **gpu),  # no resource recorded
        "cpu": run("i-0cpu", at(23, 10), 60, gpus=0, power_w=90.0, vcpus=8),
    }
    rows = invoice_rows()
    outcome = pricing_table_import_focus(
        tenant=tenant, stream=io.BytesIO(to_csv(rows)), filename="aws-2026-05.csv"
    )
    for name, r in runs.items():
        run_reprice(
            run_id=r.pk, actor=None, reason="the invoice's prices", pricing_table=outcome.table
        )
        runs[name] = Run.objects.get(pk=r.pk)
    return Month(tenant=tenant, runs=runs, outcome=outcome, rows=rows)
