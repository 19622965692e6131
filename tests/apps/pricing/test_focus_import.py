"""Prices from the invoice: a FOCUS export of AWS, Azure or Google Cloud becomes a new version of
the tenant's prices (apps.pricing.focus), with every row it left out listed with its reason."""

from __future__ import annotations

import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.experiments.selectors import gpu_skus_in_use
from apps.pricing.focus import pricing_table_import_focus
from apps.pricing.models import FocusImport, GpuPrice, GpuSku, InstanceType, PricingTable
from tests.apps.pricing.focus_files import BASE, aws, azure, gcp, to_csv, to_parquet, usage
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    GpuPriceFactory,
    GpuSkuFactory,
    PricingTableFactory,
    RunFactory,
    TenantFactory,
)

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 SXM 80GB"


def imported(tenant, data: bytes, **kwargs):
    return pricing_table_import_focus(
        tenant=tenant, stream=io.BytesIO(data), filename="export.csv", **kwargs
    )


def aws_month() -> list[dict]:
    """An AWS month: p5 on demand and under a savings plan, L4 and CPU instances, and one row of
    each kind the import leaves out."""
    p5 = aws("p5.48xlarge", hours=10, effective="550.00", listed="983.20")
    return [
        p5,  # 1
        aws(  # 2: covered by a savings plan: EffectiveCost is its amortised share
            "p5.48xlarge",
            hours=5,
            effective="200.00",
            listed="491.60",
            BilledCost="0",
            CommitmentDiscountId="arn:aws:savingsplans::123456789012:savingsplan/sp-1",
            CommitmentDiscountStatus="Used",
        ),
        aws(  # 3: the plan's unused hour: no instance's usage
            "p5.48xlarge",
            hours=1,
            effective="40.00",
            CommitmentDiscountId="arn:aws:savingsplans::123456789012:savingsplan/sp-1",
            CommitmentDiscountStatus="Unused",
        ),
        aws("g6.xlarge", hours=2, effective="1.60", listed="1.61"),  # 4
        aws("m7i.2xlarge", hours=10, effective="4.032", listed="4.032"),  # 5
        {
            **p5,
            "ChargeCategory": "Tax",
            "PricingQuantity": "",
            "PricingUnit": "",  # 6
            "EffectiveCost": "95.00",
            "BilledCost": "95.00",
            "x_UsageType": "",
        },
        {
            **p5,
            "ChargeCategory": "Credit",
            "EffectiveCost": "-100.00",  # 7
            "BilledCost": "-100.00",
            "PricingQuantity": "",
            "PricingUnit": "",
        },
        {
            **p5,
            "ChargeCategory": "Purchase",
            "ChargeFrequency": "One-Time",  # 8
            "EffectiveCost": "0",
            "BilledCost": "5000.00",
        },
        aws(
            "ignored",
            hours=720,
            effective="23.00",
            PricingUnit="GB-Mo",  # 9: storage
            x_UsageType="USE1-TimedStorage-ByteHrs",
            ServiceName="Amazon S3",
        ),
        aws("x2iedn.32xlarge", hours=3, effective="80.04"),  # 10: not in the catalogue
        {**p5, "BillingAccountId": "999999999999"},  # 11
        {**p5, "BillingCurrency": "EUR"},  # 12
        aws("p5.48xlarge", hours=0, effective="0"),  # 13
        aws("p5.48xlarge", hours=-2, effective="-110.00"),  # 14: a refund
        dict(p5),  # 15: row 1 again
        aws("nat", hours=24, effective="1.08", x_UsageType="USE1-NatGateway-Hours"),  # 16
        {**p5, "ChargeClass": "Correction", "ChargePeriodStart": "2026-04-30T00:00:00Z"},  # 17
    ]


def by_reason(outcome) -> dict[str, dict]:
    return {g["reason"]: g for g in outcome.shown()["skipped"]}


def test_an_aws_export_prices_gpu_and_vcpu_hours_to_the_cent_and_lists_every_row_left_out():
    tenant = TenantFactory()
    outcome = imported(tenant, to_csv(aws_month()))
    assert outcome.created and not outcome.already_imported
    table = outcome.table
    rates = {p.sku.name: p.hourly_usd for p in table.gpu_prices.select_related("sku")}
    # p5.48xlarge: (550 + 200) / 15 h = 50.00 per instance-hour, 6.25 per GPU-hour
    assert rates[H100] == Decimal("6.25")
    assert rates["NVIDIA L4 24GB"] == Decimal("0.80")  # 1.60 / 2 h, one L4
    assert table.vcpu_hour_usd == Decimal("0.0504")  # 4.032 / (10 h x 8 vCPUs)
    assert table.memory_gb_hour_usd == 0 and table.electricity_usd_per_kwh == 0
    assert table.currency == "USD"
    assert table.name == "from invoice INV-AWS-2026-05, period 2026-05-01..2026-06-01"
    shown = outcome.shown()
    p5 = next(t for t in shown["derived"]["instance_types"] if t["instance_type"] == "p5.48xlarge")
    assert p5["hours"] == "15.000000" and p5["commitment_hours"] == "5.000000"
    assert p5["effective_hourly"] == "50.000000" and p5["effective_per_gpu_hour"] == "6.250000"
    assert p5["list_hourly"] == "98.320000"  # (983.20 + 491.60) / 15
    assert shown["billing_account"] == "123456789012" and shown["focus_version"] == "1.2"

    skipped = by_reason(outcome)
    expected = {
        "unused commitment (no instance's usage)": [3],
        "tax": [6],
        "credit": [7],
        "purchase (a commitment's fee: its amortised share is in the usage rows' EffectiveCost)": [
            8
        ],
        "non-hourly unit": [9],
        "unknown instance type": [10],
        "other billing account": [11],
        "other currency": [12],
        "zero quantity": [13],
        "negative quantity (a refund or correction, not a price)": [14],
        "duplicate row": [15],
        "no instance type": [16],
        "correction of an earlier period": [17],
    }
    assert {r: g["row_numbers"] for r, g in skipped.items()} == expected
    assert skipped["unknown instance type"]["detail"] == "x2iedn.32xlarge"
    assert skipped["no instance type"]["detail"] == (
        "ServiceCategory Compute; none named in x_UsageType (BoxUsage:<type>)"
    )
    assert skipped["other currency"]["effective_cost"] == {"EUR": "550.000000"}
    assert skipped["tax"]["effective_cost"] == {"USD": "95.000000"}
    counted = sum(t["rows"] for t in shown["derived"]["instance_types"])
    assert counted + sum(g["rows"] for g in shown["skipped"]) == shown["rows"] == 17


def test_azure_and_google_exports_name_their_instances_their_own_way():
    tenant = TenantFactory()
    az = imported(
        tenant,
        to_csv(
            [
                azure("Standard_ND96isr_H100_v5", hours=4, effective="392.00", listed="393.60"),
                azure("Standard_D8s_v5", hours=10, effective="3.84"),
            ]
        ),
    )
    rates = {p.sku.name: p.hourly_usd for p in az.table.gpu_prices.select_related("sku")}
    assert rates[H100] == Decimal("12.25")  # 392 / 4 h / 8 GPUs
    assert az.table.vcpu_hour_usd == Decimal("0.048")  # 3.84 / 80 vCPU-hours
    assert az.table.name == "from invoice G012345678, period 2026-05-01..2026-06-01"

    google = imported(
        tenant,
        to_csv(
            [
                gcp("a3-highgpu-8g", hours=3, effective="264.00"),
                gcp("n2-standard-8", hours=5, effective="1.94", gpus=0, cores=8),
                # one GPU's SKU of the machine, priced per GPU-hour: not an instance-hour
                gcp("a3-highgpu-8g", hours=24, effective="264.00", gpus=1),
            ]
        ),
    )
    (component,) = google.shown()["skipped"]
    assert component["reason"] == "priced per component, not per instance-hour"
    assert component["detail"] == "SkuPriceDetails GpuCount 1 of a3-highgpu-8g's 8"
    assert component["row_numbers"] == [3]
    version = google.table
    assert version.supersedes_id == az.table.pk  # a version of the table in force
    assert version.gpu_prices.get(sku__name=H100).hourly_usd == Decimal("11")  # 264 / 3 / 8
    assert version.vcpu_hour_usd == Decimal("0.0485")  # 1.94 / 40
    assert google.shown()["focus_version"] == "1.2"  # InvoiceId: 1.2's


def test_the_new_version_keeps_the_other_skus_and_never_edits_the_one_in_force():
    tenant = TenantFactory()
    before = timezone.now() - timedelta(days=30)
    table = PricingTableFactory(
        tenant=tenant, valid_from=before, electricity_usd_per_kwh=Decimal("0.12")
    )
    h100 = GpuSkuFactory(name=H100)
    a100 = GpuSkuFactory(name="NVIDIA A100 SXM 80GB")
    GpuPriceFactory(pricing_table=table, sku=h100, hourly_usd=Decimal("3.00"))
    GpuPriceFactory(pricing_table=table, sku=a100, hourly_usd=Decimal("1.80"))
    outcome = imported(tenant, to_csv([aws("p5.48xlarge", hours=2, effective="100.00")]))
    version = outcome.table
    assert version.pk != table.pk and version.supersedes_id == table.pk
    assert {p.sku_id: p.hourly_usd for p in version.gpu_prices.all()} == {
        h100.pk: Decimal("6.25"),
        a100.pk: Decimal("1.80"),
    }
    table.refresh_from_db()
    assert table.electricity_usd_per_kwh == Decimal("0.12") and table.valid_from == before
    assert {p.sku_id: p.hourly_usd for p in table.gpu_prices.all()} == {
        h100.pk: Decimal("3.00"),
        a100.pk: Decimal("1.80"),
    }


def commitment_month(*, instance_types: bool) -> list[dict]:
    """A day in the shape of the FinOps Foundation's commitment-discount example files (FOCUS 1.2
    columns only: ResourceId, SkuId, the CommitmentDiscount* columns, no SkuPriceDetails and no
    provider's x_ column; the values are ours): a savings plan's purchase, three hours it covers,
    two it leaves unused, on-demand CPU hours, a managed database's hours and storage.
    `instance_types`: the compute rows name theirs in SkuPriceDetails (FOCUS 1.1+)."""
    plan = "arn:example:savingsplan/sp-1"

    def row(**values) -> dict:
        shaped = {
            **usage(hours=1, effective="0", invoice="INV-EX-1", provider="Example Cloud"),
            "ServiceName": "Example Compute",
            "ServiceSubcategory": "Virtual Machines",
            "ResourceType": "Virtual Machine",
            "SkuId": "EX-COMPUTE",
            "CommitmentDiscountId": "",
            "CommitmentDiscountStatus": "",
        }
        if instance_types:
            shaped["SkuPriceDetails"] = ""
        return shaped | values

    def hour(i: int) -> dict:
        return {
            "ChargePeriodStart": f"2026-05-14T{i:02d}:00:00Z",
            "ChargePeriodEnd": f"2026-05-14T{i + 1:02d}:00:00Z",
        }

    gpu = {"SkuPriceDetails": '{"InstanceType": "p5.48xlarge"}'} if instance_types else {}
    cpu = {"SkuPriceDetails": '{"InstanceType": "m7i.2xlarge"}'} if instance_types else {}
    covered = dict(
        BilledCost="0",
        EffectiveCost="30.00",
        ListCost="50.00",
        CommitmentDiscountId=plan,
        CommitmentDiscountStatus="Used",
    )
    return [
        row(  # 1: the plan's fee, a year's charge period; FOCUS: EffectiveCost 0
            ChargeCategory="Purchase",
            ChargeFrequency="One-Time",
            ChargePeriodEnd="2027-05-14T00:00:00Z",
            BilledCost="2400.00",
            ListCost="2400.00",
            PricingUnit="Units",
            ResourceId=plan,
            CommitmentDiscountId=plan,
        ),
        *(row(ResourceId=f"vm-{i}", **hour(i), **covered, **gpu) for i in range(3)),  # 2-4
        *(  # 5-6: the plan's unused hours: no resource, no instance type in any file
            row(**hour(i), **{**covered, "CommitmentDiscountStatus": "Unused"}) for i in range(3, 5)
        ),
        row(  # 7: on demand
            ResourceId="vm-cpu",
            PricingQuantity="2",
            EffectiveCost="0.80",
            BilledCost="0.80",
            ListCost="0.80",
            **cpu,
        ),
        row(  # 8: a managed database's hours: no instance of the catalogue's
            ServiceCategory="Databases",
            ServiceName="Example SQL",
            ResourceId="db-0",
            EffectiveCost="0.15",
            ListCost="0.15",
        ),
        row(  # 9
            ServiceCategory="Storage",
            ResourceId="bucket-0",
            PricingQuantity="250",
            PricingUnit="GB",
            EffectiveCost="5.75",
            ListCost="5.75",
        ),
    ]


def test_commitment_example_files_rows_without_instance_type_say_where_costlab_looked():
    """The FOCUS examples' shape: a file naming no instance type at all is refused, its rows
    grouped by ServiceCategory with the columns costlab reads one from; once the compute rows name
    theirs, the covered hours price at EffectiveCost / PricingQuantity and the purchase and the
    unused hours stay out."""
    tenant = TenantFactory()
    nowhere = (
        "the file has no column that names one: SkuPriceDetails (InstanceType), "
        "x_SkuDetails (ServiceType), x_UsageType (BoxUsage:<type>)"
    )
    with pytest.raises(ApplicationError, match="^file: no hourly usage of a known instance") as no:
        imported(tenant, to_csv(commitment_month(instance_types=False)))
    assert f"4 no instance type (ServiceCategory Compute; {nowhere})" in no.value.message
    groups = {(g["reason"], g["detail"]): g for g in no.value.extra["skipped"]}
    assert {key: g["row_numbers"] for key, g in groups.items()} == {
        ("no instance type", f"ServiceCategory Compute; {nowhere}"): [2, 3, 4, 7],
        ("no instance type", f"ServiceCategory Databases; {nowhere}"): [8],
        ("unused commitment (no instance's usage)", "CommitmentDiscountStatus Unused"): [5, 6],
        (
            "purchase (a commitment's fee: its amortised share is in the usage rows' "
            "EffectiveCost)",
            "ChargeCategory Purchase",
        ): [1],
        ("non-hourly unit", "PricingUnit GB"): [9],
    }
    assert not PricingTable.objects.exists() and not FocusImport.objects.exists()

    outcome = imported(tenant, to_csv(commitment_month(instance_types=True)))
    shown = outcome.shown()
    m7i, p5 = sorted(shown["derived"]["instance_types"], key=lambda t: t["instance_type"])
    assert p5["instance_type"] == "p5.48xlarge" and m7i["instance_type"] == "m7i.2xlarge"
    # 3 covered hours at their amortised 30.00 each; not the unused hours' 60.00, not the fee
    assert (p5["rows"], p5["hours"], p5["commitment_hours"]) == (3, "3.000000", "3.000000")
    assert p5["effective_cost"] == "90.000000" and p5["billed_cost"] == "0.000000"
    assert p5["effective_hourly"] == "30.000000" and p5["list_hourly"] == "50.000000"
    assert outcome.table.gpu_prices.get().hourly_usd == Decimal("3.75")  # 30.00 / 8 GPUs
    assert outcome.table.vcpu_hour_usd == Decimal("0.05")  # 0.80 / (2 h x 8 vCPUs)
    skipped = by_reason(outcome)
    assert skipped["unused commitment (no instance's usage)"]["effective_cost"] == {
        "USD": "60.000000"
    }
    assert skipped["no instance type"]["row_numbers"] == [8]
    assert skipped["no instance type"]["detail"] == (
        "ServiceCategory Databases; none named in SkuPriceDetails (InstanceType)"
    )
    counted = sum(t["rows"] for t in shown["derived"]["instance_types"])
    assert counted + sum(g["rows"] for g in shown["skipped"]) == shown["rows"] == 9


def test_the_same_file_twice_makes_one_version():
    tenant = TenantFactory()
    data = to_csv(aws_month())
    first = imported(tenant, data)
    again = imported(tenant, data)
    assert again.already_imported and not again.created
    assert again.table.pk == first.table.pk and again.record.pk == first.record.pk
    assert PricingTable.objects.filter(tenant=tenant).count() == 1
    assert FocusImport.objects.filter(tenant=tenant).count() == 1
    # another tenant's import of the same file is its own
    assert imported(TenantFactory(), data).created


def test_parquet_read_in_batches_gives_the_csv_prices():
    rows = aws_month()
    from_csv = imported(TenantFactory(), to_csv(rows)).shown()
    from_parquet = imported(TenantFactory(), to_parquet(rows)).shown()
    assert from_parquet["derived"] == from_csv["derived"]
    assert [(g["reason"], g["row_numbers"]) for g in from_parquet["skipped"]] == [
        (g["reason"], g["row_numbers"]) for g in from_csv["skipped"]
    ]


def test_a_file_that_is_not_focus_is_refused_naming_the_columns_and_nothing_is_stored():
    tenant = TenantFactory()
    cur = (
        b"lineItem/UsageAccountId,lineItem/UnblendedCost,product/instanceType\n1,2.0,p5.48xlarge\n"
    )
    with pytest.raises(ApplicationError) as refused:
        imported(tenant, cur)
    message = refused.value.message
    assert message.startswith("columns: not a FOCUS 1.0 cost-and-usage file")
    for column in ("BilledCost", "EffectiveCost", "PricingQuantity", "ChargeCategory"):
        assert column in message and column in refused.value.extra["missing"]

    missing_one = [{k: v for k, v in aws_month()[0].items() if k != "ListCost"}]
    with pytest.raises(ApplicationError, match="mandatory columns missing: ListCost$"):
        imported(tenant, to_csv(missing_one))
    with pytest.raises(ApplicationError, match="FocusVersion: '0.5' is not a FOCUS version"):
        imported(tenant, to_csv([{**aws_month()[0], "FocusVersion": "0.5"}]))
    with pytest.raises(ApplicationError, match="^file: no hourly usage of a known instance"):
        imported(tenant, to_csv([aws("x2iedn.32xlarge", hours=3, effective="80.04")]))
    with pytest.raises(ApplicationError, match="^file: not a readable Parquet file"):
        imported(tenant, to_parquet(aws_month())[:200])
    assert not PricingTable.objects.exists() and not FocusImport.objects.exists()
    assert not GpuPrice.objects.exists()


def test_a_refused_first_table_stores_nothing_not_even_the_sku_it_would_have_made():
    """A tenant's first table must price the GPUs its runs use (409 naming them, as a table posted
    by hand): the import's transaction leaves nothing behind, the catalogue's SKU included."""
    tenant = TenantFactory()
    in_use = GpuSkuFactory(name="NVIDIA B200")
    RunFactory(
        arm=ArmFactory(experiment=ExperimentFactory(tenant=tenant)),
        status="running",
        gpu_sku=in_use,
        gpu_count=8,
    )
    data = to_csv([aws("p5.48xlarge", hours=2, effective="100.00")])
    with pytest.raises(ApplicationError, match="gpu_prices: no price for NVIDIA B200") as refused:
        imported(tenant, data, skus_in_use=gpu_skus_in_use(tenant=tenant))
    assert refused.value.status_code == 409
    assert not GpuSku.objects.filter(name=H100).exists()
    assert not PricingTable.objects.exists() and not FocusImport.objects.exists()
    confirmed = imported(
        tenant, data, skus_in_use=gpu_skus_in_use(tenant=tenant), confirm_unpriced=True
    )
    assert confirmed.created and confirmed.table.gpu_prices.get().sku.name == H100


def test_focus_1_3_names_the_service_and_host_provider():
    row = {**aws("p5.48xlarge", hours=1, effective="55.00"), "FocusVersion": "1.3"}
    del row["ProviderName"], row["PublisherName"]
    tenant = TenantFactory()
    with pytest.raises(ApplicationError, match="ServiceProviderName, HostProviderName$"):
        imported(tenant, to_csv([row]))
    row |= {"ServiceProviderName": "AWS", "HostProviderName": "AWS"}
    outcome = imported(tenant, to_csv([row]))
    assert outcome.shown()["focus_version"] == "1.3"
    assert outcome.table.gpu_prices.get().hourly_usd == Decimal("6.875")


def test_the_catalogue_is_shipped_and_yours_to_extend():
    shipped = {t.name: t for t in InstanceType.objects.all()}
    for name in ("p5.48xlarge", "Standard_ND96isr_H100_v5", "a3-highgpu-8g"):
        assert shipped[name].gpu_sku_name == H100 and shipped[name].gpu_count == 8
    assert shipped["m7i.2xlarge"].gpu_count == 0 and shipped["m7i.2xlarge"].vcpus == 8
    InstanceType.objects.create(
        provider="aws", name="x2iedn.32xlarge", vcpus=128, memory_gib=4096, catalogue_version=0
    )
    outcome = imported(TenantFactory(), to_csv([aws("x2iedn.32xlarge", hours=3, effective="48")]))
    assert outcome.table.vcpu_hour_usd == Decimal("0.125")  # 48 / (3 h x 128 vCPUs)


def test_base_row_has_every_mandatory_column():
    from apps.pricing.focus import MANDATORY

    assert set(MANDATORY["1.2"]) <= set(BASE)
