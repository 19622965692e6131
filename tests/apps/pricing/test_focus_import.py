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
from apps.pricing.models import (
    FocusImport,
    FocusUsage,
    GpuPrice,
    GpuSku,
    InstanceType,
    PricingTable,
)
from tests.apps.pricing.focus_files import (
    BASE,
    CONVERTED,
    aws,
    azure,
    converted_azure,
    converted_cur,
    gcp,
    to_csv,
    to_parquet,
    usage,
)
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
            [  # Google bills a machine as its components, each naming the machine type
                gcp("a3-highgpu-8g", "cores", quantity=624, effective="93.60", listed="120.00"),
                gcp("a3-highgpu-8g", "memory", quantity=5616, effective="28.08", listed="36.00"),
                gcp("a3-highgpu-8g", "gpus", quantity=24, effective="264.00", listed="330.00"),
                gcp("n2-standard-8", "cores", quantity=40, effective="1.28"),
                gcp("n2-standard-8", "memory", quantity=160, effective="0.66"),
                gcp(None, "cores", quantity=16, effective="0.50"),  # 6: no machine type named
            ]
        ),
    )
    shown = google.shown()
    (component,) = shown["skipped"]
    assert component["reason"] == "machine component without its machine type"
    assert component["detail"] == (
        "cores: none named in SkuPriceDetails (InstanceType), Tags "
        "(compute.googleapis.com/machine_spec)"
    )
    assert component["row_numbers"] == [6]
    version = google.table
    assert version.supersedes_id == az.table.pk  # a version of the table in force
    # a3: 24 GPU-hours / 8 GPUs = 3 instance-hours (624 vCPU-h / 208, 5616 GiB-h / 1872 agree);
    # (93.60 + 28.08 + 264.00) / 3 h = 128.56 an instance-hour, / 8 GPUs
    assert version.gpu_prices.get(sku__name=H100).hourly_usd == Decimal("16.07")
    # n2-standard-8: 40 vCPU-hours / 8 = 5 instance-hours (160 GiB-h / 32 agree); (1.28 + 0.66) / 40
    assert version.vcpu_hour_usd == Decimal("0.0485")
    types = {t["instance_type"]: t for t in shown["derived"]["instance_types"]}
    a3, n2 = types["a3-highgpu-8g"], types["n2-standard-8"]
    assert a3["derived"] == "from components: cores, memory, GPUs"
    assert n2["derived"] == "from components: cores, memory"
    assert (a3["component_measure"], n2["component_measure"]) == ("GPUs", "cores")
    assert (a3["hours"], a3["effective_cost"], a3["effective_hourly"]) == (
        "3.000000",
        "385.680000",
        "128.560000",
    )
    assert a3["list_hourly"] == "162.000000"  # (120 + 36 + 330) / 3 h
    assert {k: (c["quantity"], c["instance_hours"]) for k, c in a3["components"].items()} == {
        "cores": ("624", "3"),
        "memory": ("5616", "3"),
        "gpus": ("24", "3"),
    }
    assert n2["memory_gib"] == "32" and n2["components"]["memory"]["unit"] == "GiB-hours"
    assert a3["component_disagreements"] == n2["component_disagreements"] == []
    assert shown["derived"]["component_disagreements"] == []
    assert shown["focus_version"] == "1.2"  # InvoiceId: 1.2's


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
        "x_SkuDetails (ServiceType), x_UsageType (BoxUsage:<type>), AdditionalInfo (ServiceType), "
        "lineItem/UsageType (BoxUsage:<type>), line_item_usage_type (BoxUsage:<type>)"
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


# --- what the FinOps Foundation's focus-converter writes (rows of our own in its shape) ----------

SAVINGS_PLAN = "arn:aws:savingsplans::210987654321:savingsplan/sp-9"


def converted_cur_month() -> list[dict]:
    """A legacy CUR through focus-converter: on demand, hours a savings plan covers and their
    negation line (the converter makes both Usage), CPU, storage, the plan's fee, tax, a credit
    (an Adjustment there) and an instance type the catalogue lacks."""
    plan = {"CommitmentDiscountId": SAVINGS_PLAN}
    return [
        converted_cur("BoxUsage:p5.48xlarge", hours=10, effective="600.00", listed="983.20"),  # 1
        converted_cur(  # 2: covered: EffectiveCost the plan's rate, BilledCost on demand's
            "USE1-BoxUsage:p4d.24xlarge",
            hours=4,
            effective="96.00",
            billed="131.12",
            listed="131.12",
            **plan,
            **{"lineItem/LineItemType": "SavingsPlanCoveredUsage"},
        ),
        converted_cur(  # 3: its negation: the same hours again, BilledCost below 0, no list
            "USE1-BoxUsage:p4d.24xlarge",
            hours=4,
            effective="0",
            billed="-131.12",
            **plan,
            **{"lineItem/LineItemType": "SavingsPlanNegation"},
        ),
        converted_cur("BoxUsage:m7i.2xlarge", hours=5, effective="2.00", listed="2.016"),  # 4
        converted_cur(  # 5
            "EBS:VolumeUsage.gp3", hours=1, effective="0.08", PricingUnit="GB-Mo", ConsumedUnit=""
        ),
        {  # 6: the plan's fee
            **converted_cur("ComputeSP:1yrNoUpfront", hours=24, effective="384.00", **plan),
            "ChargeCategory": "Purchase",
            "BilledCost": "480.00",
        },
        {**converted_cur("", hours=1, effective="90.00"), "ChargeCategory": "Tax"},  # 7
        {**converted_cur("", hours=0, effective="-25.00"), "ChargeCategory": "Adjustment"},  # 8
        converted_cur("BoxUsage:x2iedn.32xlarge", hours=3, effective="80.04"),  # 9
    ]


def test_a_converted_aws_cur_imports_by_its_own_columns_and_lists_every_row_left_out():
    """focus-converter writes FOCUS's names before 1.0 and carries the CUR's columns over: the
    file is read as "pre-1.0", the instance type from lineItem/UsageType (line_item_usage_type in
    the CUR's Parquet), "Hrs" as hours; the savings plan's negation line is no second set of
    hours."""
    rows = converted_cur_month()
    tenant = TenantFactory()
    with pytest.raises(
        ApplicationError, match=r"(?s)missing: ChargeClass, Contracted.*1\.0\)$"
    ) as asked:
        imported(tenant, to_csv(rows), focus_version="1.0")
    assert asked.value.message.endswith(
        "mandatory columns missing: ChargeClass, ContractedCost, InvoiceIssuerName, "
        "ProviderName, PublisherName (the file has InvoiceIssuer, Provider, Publisher: names "
        "before FOCUS 1.0)"
    )

    outcome = imported(tenant, to_csv(rows))
    shown = outcome.shown()
    assert shown["focus_version"] == "pre-1.0"
    assert outcome.table.name == "from invoice INV-CUR-0526, period 2026-05-01..2026-06-01"
    rates = {p.sku.name: p.hourly_usd for p in outcome.table.gpu_prices.select_related("sku")}
    assert rates[H100] == Decimal("7.5")  # 600 / 10 h / 8 GPUs
    assert rates["NVIDIA A100 SXM 40GB"] == Decimal("3")  # the plan's 96 / 4 h / 8 GPUs
    assert outcome.table.vcpu_hour_usd == Decimal("0.05")  # 2.00 / (5 h x 8 vCPUs)
    p4d = next(
        t for t in shown["derived"]["instance_types"] if t["instance_type"] == "p4d.24xlarge"
    )
    assert (p4d["hours"], p4d["effective_hourly"], p4d["list_hourly"]) == (
        "4.000000",
        "24.000000",
        "32.780000",
    )
    skipped = {r: (g["detail"], g["row_numbers"]) for r, g in by_reason(outcome).items()}
    assert skipped == {
        "negative cost of hours (a negation or discount, not a price)": (
            "BilledCost -131.12",
            [3],
        ),
        "non-hourly unit": ("PricingUnit GB-Mo", [5]),
        "purchase (a commitment's fee: its amortised share is in the usage rows' EffectiveCost)": (
            "ChargeCategory Purchase",
            [6],
        ),
        "tax": ("ChargeCategory Tax", [7]),
        "adjustment": ("ChargeCategory Adjustment", [8]),
        "unknown instance type": ("x2iedn.32xlarge", [9]),
    }
    counted = sum(t["rows"] for t in shown["derived"]["instance_types"])
    assert counted + sum(g["rows"] for g in shown["skipped"]) == shown["rows"] == 9

    # the CUR's Parquet delivery names its columns line_item_usage_type, bill_invoice_id
    renamed = {"lineItem/UsageType": "line_item_usage_type", "bill/InvoiceId": "bill_invoice_id"}
    snake = [{renamed.get(k, k): v for k, v in row.items()} for row in rows]
    again = imported(TenantFactory(), to_parquet(snake)).shown()
    assert again["derived"]["prices"] == shown["derived"]["prices"]
    assert again["skipped"] == shown["skipped"] and again["invoice_ids"] == ["INV-CUR-0526"]


def test_converted_azure_costs_price_by_consumed_hours_without_a_list_price():
    """Azure's cost details through focus-converter: no PricingUnit, PricingQuantity or ListCost,
    so the hours are ConsumedQuantity's (ConsumedUnit Hours) and the list price is unknown; the
    size in AdditionalInfo; its unused reservation hours (Usage there) left out by Azure's
    ChargeType, and covered hours of an actual-cost export (EffectiveCost 0) are no price."""
    ri = "/providers/Microsoft.Capacity/reservationOrders/1/reservations/2"
    h100 = "Standard_ND96isr_H100_v5"
    rows = [
        converted_azure(h100, hours=10, cost="900.00"),  # 1
        converted_azure(h100, hours=4, cost="240.00", CommitmentDiscountId=ri),  # 2: amortised
        converted_azure(None, hours=2, cost="120.00", ChargeType="UnusedReservation"),  # 3
        converted_azure(h100, hours=3, cost="0", CommitmentDiscountId=ri),  # 4: actual cost
        converted_azure("Standard_D8s_v5", hours=10, cost="3.84"),  # 5
        converted_azure(None, hours="0.0323", cost="4.40", unit="Units/Month"),  # 6: a disk
        {**converted_azure(h100, hours=1, cost="12000"), "ChargeCategory": "Purchase"},  # 7
    ]
    assert list(rows[0])[: len(CONVERTED)] == list(CONVERTED)
    outcome = imported(TenantFactory(), to_csv(rows))
    shown = outcome.shown()
    assert shown["focus_version"] == "pre-1.0"  # not 1.2, for all Azure's own InvoiceId column
    assert outcome.table.name == "from invoice G087654321, period 2026-05-01..2026-05-31"
    assert outcome.table.gpu_prices.get(sku__name=H100).hourly_usd == Decimal("10.178571")
    assert outcome.table.vcpu_hour_usd == Decimal("0.048")  # 3.84 / (10 h x 8 vCPUs)
    nd = next(t for t in shown["derived"]["instance_types"] if t["instance_type"] == h100)
    assert (nd["rows"], nd["hours"], nd["effective_hourly"]) == (2, "14.000000", "81.428571")
    assert nd["list_hourly"] is None and nd["rows_without_list_cost"] == 2
    assert nd["rows_hours_from_consumed_quantity"] == 2
    skipped = {r: (g["detail"], g["row_numbers"]) for r, g in by_reason(outcome).items()}
    assert skipped == {
        "unused commitment (no instance's usage)": ("ChargeType UnusedReservation", [3]),
        "commitment-covered hours at EffectiveCost 0 (not amortised: a cost export without "
        "the commitment's share)": (f"CommitmentDiscountId {ri}", [4]),
        "non-hourly unit": ("ConsumedUnit Units/Month", [6]),
        "purchase (a commitment's fee: its amortised share is in the usage rows' EffectiveCost)": (
            "ChargeCategory Purchase",
            [7],
        ),
    }


def converted_google(
    machine: str | None, sku: str, *, quantity, unit="hour", cost, resource="a3-0"
) -> dict:
    """A row of Google Cloud's billing export through focus-converter (Parquet: the export's structs
    carried over): the machine named only in system_labels, the SKU's description only in its sku
    column (the converter leaves ChargeDescription empty)."""
    labels = [{"key": "compute.googleapis.com/machine_spec", "value": machine}]
    return {
        **dict.fromkeys(CONVERTED),
        "ChargePeriodStart": "2026-05-14T00:00:00Z",
        "ChargePeriodEnd": "2026-05-14T10:00:00Z",
        "ChargeCategory": "Usage",
        "BillingPeriodStart": "2026-05-01T07:00:00Z",
        "BillingPeriodEnd": "2026-05-01T07:00:00Z",
        "Provider": "Google Cloud",
        "Publisher": "Google Cloud",
        "BillingAccountId": "01ABCD-000000-000000",
        "BillingCurrency": "USD",
        "BilledCost": cost,
        "EffectiveCost": cost,
        "ListCost": cost,
        "ServiceCategory": "Compute",
        "ServiceName": "Compute Engine",
        "ResourceId": f"//compute.googleapis.com/instances/{resource}",
        "PricingQuantity": quantity,
        "PricingUnit": unit,
        "ConsumedUnit": "seconds",
        "sku": {"id": "0000-0000-0001", "description": sku},
        "system_labels": labels if machine else [],
    }


def parquet_of(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


def test_converted_google_rows_price_each_machine_from_its_components():
    """Google Cloud bills a machine as its cores, memory and GPUs, each row naming the machine in
    system_labels: per machine type, the components' cost over the instance-hours its GPUs (a CPU
    type: its cores) give; the other components checked against them; the components costlab
    cannot place listed with their reason."""
    row, gib = converted_google, "gibibyte hour"
    rows = [
        row("a3-highgpu-8g", "A3 Instance Core running in Americas", quantity=2080.0, cost=880.0),
        row(
            "a3-highgpu-8g",
            "A3 Instance Ram running in Americas",
            quantity=18720.0,
            unit=gib,
            cost=100.0,
        ),
        row("a3-highgpu-8g", "Nvidia H100 80GB GPU running in Americas", quantity=80.0, cost=600.0),
        row(
            "n2-standard-8",
            "N2 Instance Core running in Americas",
            quantity=80.0,
            cost=2.4,
            resource="n2-0",
        ),
        # 5: 300 GiB-hours / 32 GiB = 9.375 instance-hours, the cores' 10: listed, and priced
        row(
            "n2-standard-8",
            "N2 Instance Ram running in Americas",
            quantity=300.0,
            unit=gib,
            cost=0.8,
            resource="n2-0",
        ),
        row(None, "N2 Instance Core running in Americas", quantity=16.0, cost=0.5),  # 6
        row("n2-standard-16", "N2 Instance Core running in Americas", quantity=160.0, cost=5.0),
        row(
            "a3-highgpu-8g", "Licensing Fee for Ubuntu Pro (CPU cost)", quantity=2080.0, cost=3.0
        ),  # 8
        row(
            "g2-standard-4",
            "G2 Instance Core running in Americas",
            quantity=40.0,
            cost=1.0,
            resource="g2-0",
        ),  # 9: a GPU machine with no GPU rows: no instance-hours
        row(
            "n2-standard-8",
            "Nvidia Tesla T4 GPU running in Americas",
            quantity=10.0,
            cost=3.5,
            resource="n2-0",
        ),  # 10
        row(None, "Balanced PD Capacity", quantity=0.4, unit="gibibyte month", cost=0.4),  # 11
    ]
    tenant = TenantFactory()
    outcome = imported(tenant, parquet_of(rows))
    shown = outcome.shown()
    assert shown["focus_version"] == "pre-1.0"
    rates = {p.sku.name: p.hourly_usd for p in outcome.table.gpu_prices.select_related("sku")}
    assert rates == {H100: Decimal("19.75")}  # (880 + 100 + 600) / (80 GPU-hours / 8 = 10 h) / 8
    assert outcome.table.vcpu_hour_usd == Decimal("0.04")  # (2.40 + 0.80) / 80 vCPU-hours
    types = {t["instance_type"]: t for t in shown["derived"]["instance_types"]}
    assert set(types) == {"a3-highgpu-8g", "n2-standard-8"}
    a3, n2 = types["a3-highgpu-8g"], types["n2-standard-8"]
    assert a3["derived"] == "from components: cores, memory, GPUs"
    assert (a3["hours"], a3["effective_hourly"], a3["list_hourly"]) == (
        "10.000000",
        "158.000000",
        "158.000000",
    )
    assert a3["component_disagreements"] == []
    assert n2["derived"] == "from components: cores, memory"
    assert (n2["hours"], n2["effective_cost"]) == ("10.000000", "3.200000")
    disagreement = (
        "memory: 300 GiB-hours over 32 are 9.375 instance-hours, its cores give 10 (6.25% apart)"
    )
    assert n2["component_disagreements"] == [disagreement]
    assert shown["derived"]["component_disagreements"] == [f"n2-standard-8: {disagreement}"]
    machine = "compute.googleapis.com/machine_spec"
    assert {(g["reason"], g["detail"]): g["row_numbers"] for g in shown["skipped"]} == {
        (
            "machine component without its machine type",
            f"cores: none named in system_labels ({machine})",
        ): [6],
        (
            "machine type not in the catalogue (priced per component)",
            f"n2-standard-16 ({machine})",
        ): [7],
        (
            "machine component costlab cannot place (unknown component or unit)",
            "a3-highgpu-8g: Licensing Fee for Ubuntu Pro (CPU cost), in hours",
        ): [8],
        (
            "machine components without their measure (no instance-hours)",
            "g2-standard-4: no GPU-hours rows (GPU-hours over the 1 GPUs one holds are its "
            "instance-hours); read: cores",
        ): [9],
        (
            "component the catalogue's machine type has none of",
            "GPUs of n2-standard-8",
        ): [10],
        ("non-hourly unit", "PricingUnit gibibyte month"): [11],
    }
    counted = sum(t["rows"] for t in shown["derived"]["instance_types"])
    assert counted + sum(g["rows"] for g in shown["skipped"]) == shown["rows"] == 11
    # reconciliation's usage: each machine's components as one, the measure's rows its hours; the
    # g2's cores, which priced nothing, taken back
    usage = {
        u.instance_type: (
            u.resource_id,
            u.hours,
            u.gpu_hours,
            u.vcpu_hours,
            u.effective_cost,
            u.rows,
        )
        for u in FocusUsage.objects.filter(focus_import_id=shown["id"])
    }
    assert usage == {
        "a3-highgpu-8g (components)": (
            "//compute.googleapis.com/instances/a3-0",
            Decimal("10"),
            Decimal("80"),
            Decimal("2080"),
            Decimal("1580"),
            3,
        ),
        "n2-standard-8 (components)": (
            "//compute.googleapis.com/instances/n2-0",
            Decimal("10"),
            Decimal("0"),
            Decimal("80"),
            Decimal("3.2"),
            2,
        ),
    }
    assert shown["derived"]["usage"]["records"] == 2


def test_a_google_file_with_no_placeable_component_is_refused_naming_each_rows_reason():
    rows = [
        converted_google(None, "A3 Instance Core running in Americas", quantity=2080.0, cost=880.0),
        converted_google(
            "a3-highgpu-8g",
            "A3 Instance Ram running in Americas",
            quantity=18720.0,
            unit="gibibyte hour",
            cost=100.0,
        ),  # 2: no GPU rows
    ]
    with pytest.raises(ApplicationError, match="^file: no hourly usage of a known instance") as no:
        imported(TenantFactory(), parquet_of(rows))
    assert [(g["reason"], g["row_numbers"]) for g in no.value.extra["skipped"]] == [
        ("machine component without its machine type", [1]),
        ("machine components without their measure (no instance-hours)", [2]),
    ]
    assert not PricingTable.objects.exists() and not FocusImport.objects.exists()
    assert not FocusUsage.objects.exists()


def test_a_google_machine_missing_a_component_is_priced_and_the_gap_listed():
    """g2-standard-4 holds one L4: its GPU SKU's GpuCount 1 is the type's own, yet on Google's
    Compute Engine it is a component (its description says so), and the machine's hours are its
    GPU-hours; no memory rows: priced from what was billed, the missing component listed."""
    g2 = "g2-standard-4"
    outcome = imported(
        TenantFactory(),
        to_csv(
            [
                gcp(
                    g2,
                    "gpus",
                    quantity=10,
                    effective="7.00",
                    ChargeDescription="Nvidia L4 GPU running in Americas",
                ),
                gcp(g2, "cores", quantity=40, effective="1.00"),  # 40 vCPU-hours / 4 = 10 h
            ]
        ),
    )
    rates = {p.sku.name: p.hourly_usd for p in outcome.table.gpu_prices.select_related("sku")}
    assert rates == {"NVIDIA L4 24GB": Decimal("0.8")}  # (7.00 + 1.00) / 10 GPU-hours
    (shown,) = outcome.shown()["derived"]["instance_types"]
    assert shown["derived"] == "from components: cores, GPUs"
    assert shown["component_disagreements"] == [
        "memory: no rows (one g2-standard-4 holds 16 GiB); their cost is not in the price"
    ]
    assert outcome.shown()["skipped"] == []
