"""FOCUS files written by the FinOps Foundation's focus-converter (PyPI `focus-converter` 1.0.0),
which turns a provider's own billing export into FOCUS: tiny native exports of our own making (an
AWS CUR, an Azure cost-details file, a Google Cloud billing export) converted by it, then imported.
Skipped unless the converter is installed: $COSTLAB_FOCUS_CONVERTER, else `focus-converter` on the
PATH (docs/billing.md, "Prices from your invoice", says how to set one up)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from apps.pricing.focus import pricing_table_import_focus
from tests.factories import TenantFactory
from tests.helpers import installed_tool

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # each test starts the converter

H100 = "NVIDIA H100 SXM 80GB"


@pytest.fixture
def convert(tmp_path):
    converter = installed_tool("COSTLAB_FOCUS_CONVERTER", "focus-converter")
    if converter is None:
        pytest.skip("needs focus-converter (set COSTLAB_FOCUS_CONVERTER; docs/billing.md)")

    def run(provider: str, source: Path, *, parquet: bool = False) -> bytes:
        out = tmp_path / f"focus-{provider}"
        out.mkdir()
        fmt = ["--data-format", "parquet", "--parquet-data-format", "file"] if parquet else []
        done = subprocess.run(
            [str(converter), "convert", "--provider", provider, "--data-path", str(source)]
            + (fmt or ["--data-format", "csv"])
            # CSV out: its writer joins the folder and the name as text; it cannot write the
            # structs of Google's export, so that one comes out as Parquet
            + ["--export-path", f"{out}{os.sep}", "--basename-template", provider]
            + ([] if parquet else ["--export-format", "csv"]),
            capture_output=True,
            text=True,
            timeout=180,
        )
        written = [p for p in out.iterdir() if p.stat().st_size]
        # it answers 0 even where its writer failed: the file is the proof
        assert done.returncode == 0 and len(written) == 1, (
            done.stdout[-2000:],
            done.stderr[-2000:],
        )
        return written[0].read_bytes()

    return run


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def imported(data: bytes):
    return pricing_table_import_focus(
        tenant=TenantFactory(), stream=io.BytesIO(data), filename="converted"
    )


def skipped(shown: dict) -> dict[str, list[int]]:
    return {g["reason"]: g["row_numbers"] for g in shown["skipped"]}


# --- AWS: a legacy Cost and Usage Report (CSV) -------------------------------------------------

PLAN = "arn:aws:savingsplans::210987654321:savingsplan/sp-9"


def cur_row(kind: str, usage_type: str, amount: str, cost: str, **more) -> dict:
    row = {
        "identity/LineItemId": "",
        "bill/InvoiceId": "INV-CUR-0526",
        "bill/InvoicingEntity": "Amazon Web Services, Inc.",
        "bill/BillType": "Anniversary",
        "bill/PayerAccountId": "210987654321",
        "bill/BillingPeriodStartDate": "2026-05-01T00:00:00Z",
        "bill/BillingPeriodEndDate": "2026-06-01T00:00:00Z",
        "lineItem/UsageAccountId": "210987654321",
        "lineItem/LineItemType": kind,
        "lineItem/UsageStartDate": "2026-05-14T00:00:00Z",
        "lineItem/UsageEndDate": "2026-05-14T10:00:00Z",
        "lineItem/ProductCode": "AmazonEC2",
        "lineItem/UsageType": usage_type,
        "lineItem/AvailabilityZone": "us-east-1a",
        "lineItem/ResourceId": "i-0feedfacefeedface",
        "lineItem/UsageAmount": amount,
        "lineItem/CurrencyCode": "USD",
        "lineItem/UnblendedCost": cost,
        "lineItem/NetUnblendedCost": "",
        "lineItem/LineItemDescription": "",
        "lineItem/LegalEntity": "Amazon Web Services, Inc.",
        "product/region": "us-east-1",
        "product/sku": "EXAMPLESKU",
        "product/PurchaseOption": "On-Demand",
        "pricing/RateCode": "EXAMPLESKU.RATE",
        "pricing/RateId": "1",
        "pricing/publicOnDemandCost": "",
        "pricing/publicOnDemandRate": "",
        "pricing/unit": "Hrs",
        "reservation/EffectiveCost": "",
        "reservation/ReservationARN": "",
        "reservation/TotalReservedUnits": "",
        "reservation/UnusedAmortizedUpfrontFeeForBillingPeriod": "",
        "reservation/UnusedRecurringFee": "",
        "savingsPlan/SavingsPlanARN": "",
        "savingsPlan/SavingsPlanEffectiveCost": "",
        "savingsPlan/TotalCommitmentToDate": "",
        "savingsPlan/UsedCommitment": "",
    }
    return row | {k.replace("__", "/"): v for k, v in more.items()}


def test_an_aws_cur_converted_prices_its_instances(convert, tmp_path):
    covered = {"savingsPlan__SavingsPlanARN": PLAN, "product__PurchaseOption": ""}
    rows = [
        cur_row("Usage", "BoxUsage:p5.48xlarge", "10", "900", pricing__publicOnDemandRate="98.32"),
        cur_row(  # 2: 4 hours a savings plan covers at 24.00 an hour
            "SavingsPlanCoveredUsage",
            "USE1-BoxUsage:p4d.24xlarge",
            "4",
            "131.12",
            savingsPlan__SavingsPlanEffectiveCost="96",
            **covered,
        ),
        cur_row("SavingsPlanNegation", "USE1-BoxUsage:p4d.24xlarge", "4", "-131.12", **covered),
        cur_row("Usage", "BoxUsage:m7i.2xlarge", "5", "2.00"),  # 4
        cur_row("Usage", "EBS:VolumeUsage.gp3", "1", "0.08", pricing__unit="GB-Mo"),  # 5
        cur_row("Tax", "", "1", "90", pricing__unit=""),  # 6
        cur_row("Credit", "", "0", "-25", pricing__unit=""),  # 7
    ]
    shown = imported(convert("aws-cur", write_csv(tmp_path / "cur.csv", rows))).shown()
    assert shown["focus_version"] == "pre-1.0"
    gpu = {p["sku"]: p["hourly_usd"] for p in shown["derived"]["prices"]["gpu_prices"]}
    assert gpu == {H100: "11.250000", "NVIDIA A100 SXM 40GB": "3.000000"}  # 900/10/8, 96/4/8
    assert shown["derived"]["prices"]["vcpu_hour_usd"] == "0.050000"  # 2.00 / (5 h x 8)
    assert skipped(shown) == {
        "negative cost of hours (a negation or discount, not a price)": [3],
        "non-hourly unit": [5],
        "tax": [6],
        "adjustment": [7],  # the converter's category for a credit
    }


# --- Azure: cost details (CSV, amortised) -------------------------------------------------------


def azure_row(charge: str, size: str | None, uom: str, quantity: str, cost: str, **more) -> dict:
    return {
        "BillingAccountId": "87654321",
        "BillingAccountName": "Example ML",
        "BillingPeriodStartDate": "05/01/2026",
        "BillingPeriodEndDate": "05/31/2026",
        "InvoiceId": "G087654321",
        "SubscriptionId": "00000000-0000-0000-0000-000000000001",
        "SubscriptionName": "training",
        "Date": "05/14/2026",
        "ProductName": "Virtual Machines",
        "MeterCategory": "Virtual Machines",
        "UnitOfMeasure": uom,
        "Quantity": quantity,
        "CostInBillingCurrency": cost,
        "BillingCurrencyCode": "USD",
        "ResourceLocation": "eastus",
        "ConsumedService": "Microsoft.Compute",
        "ResourceId": "/subscriptions/0001/resourceGroups/train/providers/Microsoft.Compute/"
        "virtualMachines/gpu-node-1",
        "ResourceName": "gpu-node-1",
        "AdditionalInfo": json.dumps({"ServiceType": size}) if size else "",
        "PublisherName": "Microsoft",
        "ChargeType": charge,
        "Frequency": "UsageBased",
        "PricingModel": "OnDemand",
        "AvailabilityZone": "",
        "benefitId": "",
        "benefitName": "",
    } | more


def test_azure_cost_details_converted_price_by_their_consumed_hours(convert, tmp_path):
    ri = "/providers/Microsoft.Capacity/reservationOrders/1/reservations/2"
    h100 = "Standard_ND96isr_H100_v5"
    rows = [
        azure_row("Usage", h100, "1 Hour", "10", "900"),
        azure_row("Usage", h100, "1 Hour", "4", "240", benefitId=ri, PricingModel="Reservation"),
        azure_row("UnusedReservation", None, "1 Hour", "2", "120", benefitId=ri),  # 3
        azure_row("Usage", "Standard_D8s_v5", "10 Hours", "10", "3.84"),  # 4
        azure_row("Usage", None, "1/Month", "0.0323", "4.40"),  # 5: a disk
    ]
    shown = imported(convert("azure", write_csv(tmp_path / "azure.csv", rows))).shown()
    assert shown["focus_version"] == "pre-1.0"
    gpu = {p["sku"]: p["hourly_usd"] for p in shown["derived"]["prices"]["gpu_prices"]}
    assert gpu == {H100: "10.178571"}  # (900 + 240) / 14 h / 8 GPUs
    assert shown["derived"]["prices"]["vcpu_hour_usd"] == "0.048000"  # 3.84 / (10 h x 8)
    assert skipped(shown) == {
        "unused commitment (no instance's usage)": [3],
        "non-hourly unit": [5],
    }
    assert all(t["list_hourly"] is None for t in shown["derived"]["instance_types"])


# --- Google Cloud: the BigQuery billing export (Parquet, its structs) ----------------------------


def test_google_billing_converted_prices_each_machine_from_its_components(convert, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def row(machine: str | None, sku: str, unit: str, pricing_unit: str, amount, hours, cost):
        # a committed use discount's credit (the converter sums credits into EffectiveCost)
        credit = {"name": "Committed use discount", "amount": -cost / 4, "type": "COMMITTED"}
        return {
            "billing_account_id": "01ABCD-000000-000000",
            "service": {"id": "6F81-5844-456A", "description": "Compute Engine"},
            "sku": {"id": "0000-0000-0001", "description": sku},
            "usage_start_time": datetime(2026, 5, 14, 0, tzinfo=UTC),
            "usage_end_time": datetime(2026, 5, 14, 10, tzinfo=UTC),
            "system_labels": (
                [{"key": "compute.googleapis.com/machine_spec", "value": machine}]
                if machine
                else []
            ),
            "location": {
                "location": "us-central1",
                "region": "us-central1",
                "zone": "us-central1-a",
            },
            "resource": {"name": "a3-0", "global_name": "//compute.googleapis.com/instances/1"},
            "cost": cost,
            "currency": "USD",
            "usage": {
                "amount": amount,
                "unit": unit,
                "amount_in_pricing_units": hours,
                "pricing_unit": pricing_unit,
            },
            "credits": [credit] if machine else [],
            "invoice": {"month": "202605"},
            "cost_type": "regular",
            "price": {"tier_start_amount": 0.0},
            "cost_at_list": cost,
            "seller_name": None,
        }

    gib = ("byte-seconds", "gibibyte hour")
    a3, n2 = "a3-highgpu-8g", "n2-standard-8"
    rows = [  # 10 hours of an a3-highgpu-8g (208 vCPUs, 1872 GiB, 8 GPUs) and an n2-standard-8
        row(
            a3, "A3 Instance Core running in Americas", "seconds", "hour", 7488000.0, 2080.0, 880.0
        ),
        row(a3, "A3 Instance Ram running in Americas", *gib, 7.2361609003008e16, 18720.0, 100.0),
        row(
            a3, "Nvidia H100 80GB GPU running in Americas", "seconds", "hour", 288000.0, 80.0, 600.0
        ),
        row(n2, "N2 Instance Core running in Americas", "seconds", "hour", 288000.0, 80.0, 2.0),
        row(n2, "N2 Instance Ram running in Americas", *gib, 1.236950581248e15, 320.0, 1.2),
        row(None, "N2 Instance Core running in Americas", "seconds", "hour", 57600.0, 16.0, 0.5),
        row(None, "Balanced PD Capacity", "byte-seconds", "gibibyte month", 1e15, 0.4, 0.4),
    ]
    source = tmp_path / "gcp.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    shown = imported(convert("gcp", source, parquet=True)).shown()
    assert shown["focus_version"] == "pre-1.0"
    gpu = {p["sku"]: p["hourly_usd"] for p in shown["derived"]["prices"]["gpu_prices"]}
    # (880 + 100 + 600) x 3/4 (the discount's credit) over 80 GPU-hours
    assert gpu == {H100: "14.812500"}
    # (2.00 + 1.20) x 3/4 over 80 vCPU-hours (10 instance-hours x 8)
    assert shown["derived"]["prices"]["vcpu_hour_usd"] == "0.030000"
    types = {t["instance_type"]: t for t in shown["derived"]["instance_types"]}
    assert types[a3]["derived"] == "from components: cores, memory, GPUs"
    assert types[n2]["derived"] == "from components: cores, memory"
    assert types[a3]["hours"] == types[n2]["hours"] == "10.000000"
    assert types[a3]["list_hourly"] == "158.000000"  # cost_at_list: (880 + 100 + 600) / 10 h
    assert shown["derived"]["component_disagreements"] == []
    assert skipped(shown) == {
        "machine component without its machine type": [6],
        "non-hourly unit": [7],
    }
    (unnamed,) = [g for g in shown["skipped"] if g["row_numbers"] == [6]]
    assert (
        unnamed["detail"]
        == "cores: none named in system_labels (compute.googleapis.com/machine_spec)"
    )
