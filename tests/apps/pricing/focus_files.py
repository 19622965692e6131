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


def gcp(instance: str, *, hours, effective, listed=None, gpus=8, cores=208, **extra) -> dict:
    """A Compute Engine row of Google Cloud's FOCUS export: the machine type in SkuPriceDetails
    (InstanceType, with the FOCUS-defined GpuCount and CoreCount of one pricing unit)."""
    details = {"InstanceType": instance, "CoreCount": cores}
    if gpus:
        details["GpuCount"] = gpus
    return {
        **usage(
            hours=hours,
            effective=effective,
            listed=listed,
            invoice="3456789012",
            provider="Google Cloud",
        ),
        "BillingAccountId": "010101-F0FFF0-61C528",
        "ServiceName": "Compute Engine",
        "ChargeDescription": f"{instance} running in Americas",
        "PricingUnit": "hour",
        "ConsumedQuantity": str(hours * 3600),
        "ConsumedUnit": "seconds",
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
