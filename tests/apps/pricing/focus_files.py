"""FOCUS files made in the tests: rows shaped as AWS, Azure and Google Cloud write them (the columns
each provider's export has, the instance type where each puts it), as CSV or Parquet."""

from __future__ import annotations

import csv
import io
import json

# The mandatory columns of FOCUS 1.0-1.2, with a usage row's values.
BASE = {
    "BilledCost": "0",
    "BillingAccountId": "123456789012",
    "BillingAccountName": "ml-platform",
    "BillingCurrency": "USD",
    "BillingPeriodEnd": "2026-06-01T00:00:00Z",
    "BillingPeriodStart": "2026-05-01T00:00:00Z",
    "ChargeCategory": "Usage",
    "ChargeClass": "",
    "ChargeDescription": "",
    "ChargePeriodEnd": "2026-05-14T01:00:00Z",
    "ChargePeriodStart": "2026-05-14T00:00:00Z",
    "ContractedCost": "0",
    "EffectiveCost": "0",
    "InvoiceIssuerName": "",
    "ListCost": "0",
    "PricingQuantity": "1",
    "PricingUnit": "Hours",
    "ProviderName": "",
    "PublisherName": "",
    "ServiceCategory": "Compute",
    "ServiceName": "",
}


def usage(*, hours, effective, listed=None, invoice: str, provider: str) -> dict:
    """What every provider's usage row says of its cost: the quantity, the costs, who billed it."""
    return {
        **BASE,
        "ProviderName": provider,
        "PublisherName": provider,
        "InvoiceIssuerName": provider,
        "ChargeFrequency": "Usage-Based",
        "InvoiceId": invoice,
        "PricingQuantity": str(hours),
        "EffectiveCost": str(effective),
        "BilledCost": str(effective),
        "ContractedCost": str(effective),
        "ListCost": str(listed if listed is not None else effective),
    }


def aws(instance: str, *, hours, effective, listed=None, **extra) -> dict:
    """An EC2 row of AWS's FOCUS 1.2 export with AWS columns: the instance type in x_UsageType."""
    return {
        **usage(
            hours=hours,
            effective=effective,
            listed=listed,
            invoice="INV-AWS-2026-05",
            provider="AWS",
        ),
        "ServiceName": "Amazon Elastic Compute Cloud",
        "ChargeDescription": f"$ per On Demand Linux {instance} Instance Hour",
        "ConsumedQuantity": str(hours),
        "ConsumedUnit": "Hours",
        "ResourceId": "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc",
        "ResourceType": "Instance",
        "RegionId": "us-east-1",
        "SkuId": "8VCNEHQMSCQS4P39",
        "SkuPriceId": "8VCNEHQMSCQS4P39.JRTCKXETXF.6YS6EN2CT7",
        "x_UsageType": f"USE1-BoxUsage:{instance}",
        "x_Operation": "RunInstances",
        "x_ServiceCode": "AmazonEC2",
        "CommitmentDiscountId": "",
        "CommitmentDiscountStatus": "",
        **extra,
    }


def azure(instance: str, *, hours, effective, listed=None, **extra) -> dict:
    """A virtual machine row of Cost Management's FOCUS export: the size in x_SkuDetails'
    ServiceType (the usage file's AdditionalInfo)."""
    return {
        **usage(
            hours=hours,
            effective=effective,
            listed=listed,
            invoice="G012345678",
            provider="Microsoft",
        ),
        "BillingAccountId": "/providers/Microsoft.Billing/billingAccounts/12345678",
        "ServiceName": "Virtual Machines",
        "ChargeDescription": f"{instance} - 1 Hour",
        "ConsumedQuantity": str(hours),
        "ConsumedUnit": "Hours",
        "ResourceId": "/subscriptions/0000/resourceGroups/train/providers/Microsoft.Compute/"
        "virtualMachines/gpu-node-0",
        "ResourceType": "Virtual machine",
        "RegionId": "eastus",
        "SkuId": "DZH318Z09V6F",
        "SkuPriceId": "DZH318Z09V6F/00JG",
        "x_SkuMeterCategory": "Virtual Machines",
        "x_SkuMeterSubcategory": "NDsr H100 v5 Series",
        "x_PricingUnitDescription": "1 Hour",
        "x_SkuDetails": json.dumps({"ServiceType": instance, "UsageType": "ComputeHR"}),
        **extra,
    }


# What Google Cloud writes of each of a machine's components: its SKU's description, its pricing
# unit and its FOCUS-defined SkuPriceDetails property (per pricing unit: one vCPU, GiB or GPU).
GCP_COMPONENTS = {
    "cores": ("{series} Instance Core running in Americas", "hour", "CoreCount"),
    "memory": ("{series} Instance Ram running in Americas", "gibibyte hour", "MemorySize"),
    "gpus": ("Nvidia H100 80GB GPU running in Americas", "hour", "GpuCount"),
}


def gcp(machine: str | None, component: str, *, quantity, effective, listed=None, **extra) -> dict:
    """A Compute Engine row of Google Cloud's FOCUS export: one component of a machine (Google bills
    its cores, memory and GPUs as SKUs of their own), PricingQuantity in vCPU-, GiB- or GPU-hours,
    the machine type in SkuPriceDetails' InstanceType (None: a row that names none)."""
    description, unit, prop = GCP_COMPONENTS[component]
    details = {prop: 1} | ({"InstanceType": machine} if machine else {})
    return {
        **usage(
            hours=quantity,
            effective=effective,
            listed=listed,
            invoice="3456789012",
            provider="Google Cloud",
        ),
        "BillingAccountId": "010101-F0FFF0-61C528",
        "ServiceName": "Compute Engine",
        "ChargeDescription": description.format(series=(machine or "n2").split("-")[0].upper()),
        "PricingUnit": unit,
        "ConsumedQuantity": str(quantity),
        "ConsumedUnit": unit,
        "ResourceId": "//compute.googleapis.com/projects/train/zones/us-central1-a/instances/a3-0",
        "RegionId": "us-central1",
        "SkuId": "9F0E-4D79-1C3A",
        "SkuPriceId": "9F0E-4D79-1C3A-0001",
        "SkuPriceDetails": json.dumps(details),
        "Tags": json.dumps({"team": "ml"}),
        "x_ServiceId": "6F81-5844-456A",
        **extra,
    }


def columns_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(c for row in rows for c in row))


def to_csv(rows: list[dict], columns: list[str] | None = None) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns or columns_of(rows), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def to_parquet(rows: list[dict], *, row_group_size: int = 3) -> bytes:
    """Costs and quantities as doubles (as AWS's Parquet export types them), the rest strings;
    small row groups, so a file is read in several batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    numbers = {"BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "PricingQuantity"}
    columns = columns_of(rows)
    arrays = {
        c: pa.array(
            [
                (float(r[c]) if r.get(c) not in (None, "") else None)
                if c in numbers
                else (r.get(c) or None)
                for r in rows
            ],
            type=pa.float64() if c in numbers else pa.string(),
        )
        for c in columns
    }
    sink = io.BytesIO()
    pq.write_table(pa.table(arrays), sink, row_group_size=row_group_size)
    return sink.getvalue()


# The FOCUS columns the FinOps Foundation's focus-converter (PyPI `focus-converter` 1.0.0) writes,
# each one even where it fills none: FOCUS's names before 1.0 (Provider, Publisher, InvoiceIssuer),
# no ChargeClass, ContractedCost or FocusVersion. The provider's own columns follow, carried over
# unchanged (its default); dates as "2026-05-14 00:00:00.000Z".
CONVERTED = (
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeFrequency",
    "ChargeDescription",
    "ChargeCategory",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "Provider",
    "Publisher",
    "InvoiceIssuer",
    "BillingAccountId",
    "BillingAccountName",
    "BilledCost",
    "BillingCurrency",
    "EffectiveCost",
    "RegionId",
    "ServiceCategory",
    "ServiceName",
    "SubAccountName",
    "SubAccountId",
    "AvailabilityZone",
    "ResourceName",
    "ResourceId",
    "ResourceType",
    "CommitmentDiscountName",
    "CommitmentDiscountId",
    "CommitmentDiscountType",
    "CommitmentDiscountCategory",
    "PricingQuantity",
    "PricingUnit",
    "PricingCategory",
    "SkuId",
    "SkuPriceId",
    "ListUnitPrice",
    "ListCost",
    "ConsumedQuantity",
    "ConsumedUnit",
)


def converted_cur(usage_type: str, *, hours, effective, billed=None, listed=None, **extra) -> dict:
    """An EC2 row of a legacy AWS CUR (CSV) once converted: the CUR's unit "Hrs", its columns
    (lineItem/UsageType, bill/InvoiceId, ...) after FOCUS's."""
    billed = effective if billed is None else billed
    return {
        **dict.fromkeys(CONVERTED, ""),
        "ChargePeriodStart": "2026-05-14 00:00:00.000Z",
        "ChargePeriodEnd": "2026-05-14 10:00:00.000Z",
        "ChargeCategory": "Usage",
        "BillingPeriodStart": "2026-05-01 00:00:00.000Z",
        "BillingPeriodEnd": "2026-06-01 00:00:00.000Z",
        "Provider": "AWS",
        "Publisher": "Amazon Web Services, Inc.",
        "InvoiceIssuer": "Amazon Web Services, Inc.",
        "BillingAccountId": "210987654321",
        "BillingCurrency": "USD",
        "BilledCost": str(billed),
        "EffectiveCost": str(effective),
        "ServiceCategory": "Compute",
        "ServiceName": "AmazonEC2",
        "ResourceId": "i-0feedfacefeedface",
        "PricingQuantity": f"{hours}.0",
        "PricingUnit": "Hrs",
        "ListCost": "" if listed is None else str(listed),
        "ConsumedQuantity": str(hours),
        "ConsumedUnit": "Hrs",
        "lineItem/LineItemType": "Usage",
        "lineItem/UsageType": usage_type,
        "bill/InvoiceId": "INV-CUR-0526",
        **extra,
    }


def converted_azure(size: str | None, *, hours, cost, unit="Hours", **extra) -> dict:
    """A virtual machine row of Azure's cost details once converted: no PricingUnit,
    PricingQuantity or ListCost (the converter fills none), the hours in ConsumedQuantity, the size
    in AdditionalInfo's ServiceType; the charge period runs from the billing period's start to the
    row's date (the converter's reading of Azure's columns)."""
    return {
        **dict.fromkeys(CONVERTED, ""),
        "ChargePeriodStart": "2026-05-01 00:00:00.000Z",
        "ChargePeriodEnd": "2026-05-14 00:00:00.000Z",
        "ChargeCategory": "Usage",
        "BillingPeriodStart": "2026-05-01 00:00:00.000Z",
        "BillingPeriodEnd": "2026-05-31 00:00:00.000Z",
        "Provider": "Azure",
        "Publisher": "Microsoft",
        "InvoiceIssuer": "Microsoft",
        "BillingAccountId": "87654321",
        "BillingAccountName": "Example ML",
        "BillingCurrency": "USD",
        "BilledCost": str(cost),
        "EffectiveCost": str(cost),
        "ServiceName": "Microsoft.Compute",
        "ResourceId": "/subscriptions/0000/resourceGroups/train/providers/Microsoft.Compute/"
        "virtualMachines/gpu-node-1",
        "ConsumedQuantity": str(hours),
        "ConsumedUnit": unit,
        # Azure's own columns: InvoiceId and PublisherName share FOCUS's names
        "InvoiceId": "G087654321",
        "PublisherName": "Microsoft",
        "ChargeType": "Usage",
        "AdditionalInfo": json.dumps({"ServiceType": size, "VCPUs": 96}) if size else "",
        **extra,
    }
