"""Prices from the bill: a FOCUS cost-and-usage export (1.0 to 1.3, CSV or Parquet; or with the
names before 1.0 that the FinOps Foundation's focus-converter writes) becomes a new version of a
tenant's pricing table.

What it reads (docs/billing.md, "Prices from your invoice"): the usage rows of whole instances
priced by the hour (ChargeCategory Usage, PricingUnit hours) whose instance type the catalogue
(apps.pricing.models.InstanceType) knows. Per instance type it sums EffectiveCost, ListCost and
PricingQuantity (instance-hours), so an instance type's effective hourly price is
sum(EffectiveCost) / sum(PricingQuantity) and its list price sum(ListCost) / sum(PricingQuantity):
commitment discounts are in EffectiveCost as FOCUS amortises them, and a commitment's unused share
(CommitmentDiscountStatus "Unused") is no instance's usage.

Google Cloud bills a machine as its components: its cores (vCPU-hours), memory (GiB-hours) and GPUs
(GPU-hours), each row naming the machine type in its labels (compute.googleapis.com/machine_spec,
in the billing export's system_labels) or in SkuPriceDetails' InstanceType. Such rows are summed per
machine type and component (_components_priced): the type's instance-hours are its measure's
hours over what one instance holds of it (GPU-hours over its GPUs; a CPU type's vCPU-hours over its
vCPUs), and its cost is every component's EffectiveCost (its list cost every component's ListCost);
each other component's instance-hours (memory: GiB-hours over its GiB) are checked against the
measure's and listed where they differ by more than 1% or have no rows. Then:

- a GPU SKU's price per GPU-hour is the effective cost of every instance type holding it over their
  GPU-hours (instance-hours x GPUs);
- the vCPU-hour price is the CPU instance types' effective cost over their vCPU-hours, memory
  included in it (memory_gb_hour_usd 0: the provider sells them together);
- electricity is 0 in the new version: an instance-hour's price includes its power (carbon keeps
  the version in force's grid intensity: it is not money).

Every other row is left out and listed with its reason (a credit, a tax, a purchase, another
billing account or currency, a unit that is not hours, an unknown instance type, a zero or
negative quantity, hours at a negative cost, a row repeated; a component whose machine type is not
named or not in the catalogue, whose component or unit costlab cannot tell, or whose type has no
rows of its measure): nothing is summed silently. Rows are streamed (CSV: the standard library's
reader; Parquet: pyarrow, by record batches) and aggregated per instance type (and component), so
memory does not grow with the file, except for one 12-byte digest per counted row (to find
repeats). Each counted row's EffectiveCost and hours are also kept per ResourceId and UTC day
(FocusUsage, written in batches as the file is read; a machine's components as "<type>
(components)", their measure's rows holding its hours), for billing's reconciliation.

A file missing a mandatory FOCUS column of its version, or of a version costlab does not know, is
refused naming the columns, and nothing is stored. The same file imported again (its SHA-256)
makes no second version: it answers with the first import.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.pricing import services
from apps.pricing.models import FocusImport, FocusUsage, GpuSku, InstanceType, PricingTable
from apps.pricing.selectors import pricing_table_valid_at
from apps.tenants.models import Tenant

CATALOGUE_FILE = Path(__file__).resolve().parent / "catalogue" / "instance_types.json"

VERSIONS = ("1.0", "1.1", "1.2", "1.3")
# The columns every FOCUS cost-and-usage dataset has (feature level Mandatory), 1.0 to 1.2.
_MANDATORY = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
)
# 1.3 names the provider twice over (ServiceProviderName, HostProviderName); ProviderName and
# PublisherName are deprecated there, so a 1.3 file is not refused for leaving them out.
MANDATORY = {
    "1.0": _MANDATORY,
    "1.1": _MANDATORY,
    "1.2": _MANDATORY,
    "1.3": tuple(c for c in _MANDATORY if c not in ("ProviderName", "PublisherName"))
    + ("ServiceProviderName", "HostProviderName"),
}
# FOCUS before 1.0 (0.5 and the drafts up to 1.0-preview) named three columns that 1.0 renamed, and
# had no ChargeClass or ContractedCost. The FinOps Foundation's focus-converter (1.0.0, which turns
# a provider's native billing export into FOCUS) still writes those names with no FocusVersion: a
# file naming Provider and not ProviderName is read as such ("pre-1.0"), the renamed columns
# standing for 1.0's.
PRE_1_0 = "pre-1.0"
RENAMED_IN_1_0 = {
    "InvoiceIssuerName": "InvoiceIssuer",
    "ProviderName": "Provider",
    "PublisherName": "Publisher",
}
MANDATORY[PRE_1_0] = tuple(
    RENAMED_IN_1_0.get(c, c) for c in _MANDATORY if c not in ("ChargeClass", "ContractedCost")
)
# Where a file may say its version (FOCUS keeps it in the dataset's metadata; some exports carry it
# as a column).
VERSION_COLUMNS = ("FocusVersion", "x_FocusVersion")

# A provider's own billing columns that focus-converter carries into its FOCUS file unchanged (with
# its default --export-include-source-columns): where AWS's CUR (its CSV headers, its Athena and
# Parquet names) and Azure's cost details name the instance type, the CUR's invoice, Azure's
# charge type (its unused reservation hours are Usage in the converter's FOCUS) and Google Cloud's
# system labels (the machine type of a core's, memory's or GPU's row).
NATIVE = (
    "lineItem/UsageType",
    "line_item_usage_type",
    "bill/InvoiceId",
    "bill_invoice_id",
    "AdditionalInfo",
    "ChargeType",
    "system_labels",
    "sku",
)
UNUSED_CHARGE_TYPES = {"UnusedReservation", "UnusedSavingsPlan"}  # Azure's, in ChargeType
GCP_MACHINE = "compute.googleapis.com/machine_spec"
# Where a row of Google Cloud may name its machine type: the billing export's system labels (carried
# over by focus-converter), the same in an x_ column, or FOCUS's Tags.
MACHINE_COLUMNS = ("system_labels", "x_SystemLabels", "Tags")

# The columns read beyond the mandatory ones, when a file has them.
OPTIONAL = (
    "CommitmentDiscountStatus",
    "CommitmentDiscountId",
    "ConsumedQuantity",
    "ConsumedUnit",
    "InvoiceId",
    "SkuPriceDetails",
    "SkuPriceId",
    "ResourceId",
    "ServiceProviderName",
    "x_SkuDetails",
    "x_UsageType",
    "x_CostlabResource",
    "x_CostlabGpuSku",
    "x_SkuDescription",
    "x_SystemLabels",
    "Tags",
    "Provider",  # FOCUS's name before 1.0 (a converted file's)
    *VERSION_COLUMNS,
    *NATIVE,
)

HOURS = {"hour", "hours", "hr", "hrs", "1 hour"}
# A machine's memory billed on its own (Google Cloud: "gibibyte hour"), spelled in lower case with
# "-" and "_" as spaces and no plural.
GIB_HOURS = {"gibibyte hour", "gib hour", "gibibyte hr", "gib hr", "1 gibibyte hour"}
UNIT_HOURS, UNIT_GIB_HOURS = "hours", "GiB-hours"
# AWS writes the instance type into its usage type: "USE1-BoxUsage:p5.48xlarge".
_AWS_USAGE = re.compile(r"(?:BoxUsage|SpotUsage|DedicatedUsage|HostBoxUsage|DedicatedRes):(.+)$")

ROWS_LISTED = 100  # row numbers kept per skipped group (the count is always whole)
DIGEST_BYTES = 12
MICRO = Decimal("0.000001")
USAGE_PLACES = Decimal("0.0000000001")  # FocusUsage's decimal places
USAGE_HELD = 5000  # (resource, day, instance type) sums held in memory before they are written
SPLIT_DAYS_MAX = 62  # a row's charge period is split over its days up to this long
ZERO = Decimal(0)
# A machine billed per component (Google Cloud's cores, memory and GPUs): each component's hours
# over its quantity in one instance are the type's instance-hours; the measure's (GPUs, else cores)
# are those priced, and a component whose own differ from them by more than this share is listed.
COMPONENT_TOLERANCE = Decimal("0.01")


def _money(value: Decimal) -> Decimal:
    return value.quantize(MICRO, rounding=ROUND_HALF_UP)


def _text(value: Decimal | None) -> str | None:
    return None if value is None else str(_money(value))


# --- reading ---------------------------------------------------------------------------------


def file_sha256(stream: IO[bytes]) -> str:
    """The file's SHA-256, read in chunks; the stream is left at its start."""
    digest = hashlib.sha256()
    stream.seek(0)
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        digest.update(chunk)
    stream.seek(0)
    return digest.hexdigest()


def _is_parquet(stream: IO[bytes]) -> bool:
    head = stream.read(4)
    stream.seek(0)
    return head == b"PAR1"


class _Table:
    """A FOCUS file's columns and its rows, streamed (each row a dict of the columns read)."""

    def __init__(self, stream: IO[bytes]):
        self.stream = stream
        self.parquet = _is_parquet(stream)
        if self.parquet:
            import pyarrow.parquet as pq  # only an import that reads Parquet loads it

            try:
                self._file = pq.ParquetFile(stream)
            except Exception as exc:
                raise ApplicationError(
                    f"file: not a readable Parquet file ({exc})",
                    {"fields": {"file": ["unreadable"]}},
                    code="invalid",
                ) from None
            self.columns = list(self._file.schema_arrow.names)
        else:
            text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
            self._reader = csv.reader(text)
            try:
                self.columns = [c.strip() for c in next(self._reader)]
            except StopIteration:
                self.columns = []
            except (UnicodeDecodeError, csv.Error) as exc:
                raise ApplicationError(
                    f"file: not a UTF-8 CSV file ({exc})",
                    {"fields": {"file": ["unreadable"]}},
                    code="invalid",
                ) from None
            self._text = text

    def rows(self, wanted: list[str]) -> Iterator[tuple[dict, Any]]:
        """(the wanted columns of a row, the whole row): the whole row tells a repeat."""
        if self.parquet:
            for batch in self._file.iter_batches(batch_size=8192):
                for whole in batch.to_pylist():
                    yield {name: whole.get(name) for name in wanted}, whole
            return
        index = [(name, self.columns.index(name)) for name in wanted]
        try:
            for values in self._reader:
                if not values:
                    continue
                row = {
                    name: (values[i] if i < len(values) and values[i] != "" else None)
                    for name, i in index
                }
                yield row, values
        except (UnicodeDecodeError, csv.Error) as exc:
            raise ApplicationError(
                f"file: CSV unreadable at line {self._reader.line_num} ({exc})",
                {"fields": {"file": ["unreadable"]}},
                code="invalid",
            ) from None

    def release(self) -> None:
        """Leave the caller's stream open (a text wrapper closes what it wraps when collected)."""
        if not self.parquet:
            self._text.detach()


def _version(columns: list[str], asked: str | None, first: dict | None) -> str:
    """The file's FOCUS version: asked for, else a version column's, else by its columns (1.3 has
    ServiceProviderName; a file naming Provider, not ProviderName, has FOCUS's names before 1.0;
    1.0 to 1.2 share their mandatory columns)."""
    said = asked
    if said is None and first is not None:
        said = next((str(first[c]) for c in VERSION_COLUMNS if first.get(c)), None)
    if said is None:  # 1.0 to 1.2 share their mandatory columns: the label is what differs
        if "ServiceProviderName" in columns:
            return "1.3"
        if "Provider" in columns and "ProviderName" not in columns:
            return PRE_1_0
        if "InvoiceId" in columns or "PricingCurrency" in columns:
            return "1.2"
        if {"SkuPriceDetails", "ServiceSubcategory", "CapacityReservationId"} & set(columns):
            return "1.1"
        return "1.0"
    said = said.strip()
    if said not in VERSIONS:
        raise ApplicationError(
            f"FocusVersion: {said!r} is not a FOCUS version costlab reads ({', '.join(VERSIONS)})",
            {"fields": {"FocusVersion": ["unknown version"]}},
            code="invalid",
        )
    return said


def _refuse_missing(columns: list[str], version: str) -> None:
    missing = [c for c in MANDATORY[version] if c not in columns]
    if missing:
        older = [RENAMED_IN_1_0[c] for c in missing if RENAMED_IN_1_0.get(c) in columns]
        hint = f" (the file has {', '.join(older)}: names before FOCUS 1.0)" if older else ""
        raise ApplicationError(
            f"columns: not a FOCUS {version} cost-and-usage file: mandatory columns missing: "
            f"{', '.join(missing)}{hint}",
            {"fields": {"file": [f"missing column {c}" for c in missing]}, "missing": missing},
            code="invalid",
        )


# --- a row -----------------------------------------------------------------------------------


def _decimal(row: dict, column: str) -> Decimal | None:
    value = row.get(column)
    if value is None or value == "":
        return None
    try:
        number = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{column}: {str(value)[:40]!r} is not a decimal") from None
    if not number.is_finite():
        raise ValueError(f"{column}: {value!r} is not a finite decimal")
    return number


def _mapping(value: Any) -> dict:
    """A FOCUS key-value column (JSON text in CSV; a map, struct or JSON text in Parquet)."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list):  # a Parquet map: [(key, value), ...]
        try:
            return dict(value)
        except (TypeError, ValueError):
            return {}
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _day(value: Any) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()[:10]
    return str(value or "")[:10]


@dataclass(frozen=True)
class Instance:
    """What one pricing unit of a row holds: an instance type of the catalogue, or one GPU-hour or
    vCPU-hour of costlab's own export (apps.billing.focus_export)."""

    key: str
    provider: str
    gpu_sku: str
    gpu_count: int
    vcpus: int
    memory_gib: Decimal = Decimal("0")


def catalogue() -> dict[str, Instance]:
    return {
        t.name.lower(): Instance(
            key=t.name,
            provider=t.provider,
            gpu_sku=t.gpu_sku_name,
            gpu_count=t.gpu_count,
            vcpus=t.vcpus,
            memory_gib=t.memory_gib,
        )
        for t in InstanceType.objects.all()
    }


def instance_name(row: dict) -> str | None:
    """The instance type a row names, wherever its provider writes it: SkuPriceDetails'
    InstanceType (FOCUS 1.1 and later, any provider), Azure's x_SkuDetails ServiceType (its
    AdditionalInfo's, where focus-converter carried that column over), or AWS's x_UsageType
    (BoxUsage:p5.48xlarge; the CUR's usage type, carried over)."""
    details = _mapping(row.get("SkuPriceDetails"))
    name = details.get("InstanceType") or details.get("F_InstanceType")
    for column in ("x_SkuDetails", "AdditionalInfo"):
        name = name or _mapping(row.get(column)).get("ServiceType")
    for column in ("x_UsageType", "lineItem/UsageType", "line_item_usage_type"):
        if not name and row.get(column):
            match = _AWS_USAGE.search(str(row[column]))
            name = match.group(1) if match else None
    return str(name).strip() if name else None


# Where a row may name its instance type: the column, and what costlab reads in it.
INSTANCE_COLUMNS = (
    ("SkuPriceDetails", "InstanceType"),
    ("x_SkuDetails", "ServiceType"),
    ("x_UsageType", "BoxUsage:<type>"),
    ("AdditionalInfo", "ServiceType"),
    ("lineItem/UsageType", "BoxUsage:<type>"),
    ("line_item_usage_type", "BoxUsage:<type>"),
)


def _label(value: Any, key: str) -> str | None:
    """A label's value in a column of labels: a list of key and value (Parquet's structs, or JSON
    text, as Google Cloud's billing export writes its labels), a Parquet map, or a key-value object
    (FOCUS's Tags)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, dict):
        found = value.get(key)
        return str(found) if found else None
    if not isinstance(value, list):
        return None
    for label in value:
        if isinstance(label, dict) and label.get("key") == key and label.get("value"):
            return str(label["value"])
        if isinstance(label, list | tuple) and len(label) == 2 and label[0] == key and label[1]:
            return str(label[1])
    return None


def _machine_spec(row: dict) -> str | None:
    """The machine type Google Cloud names in its labels (compute.googleapis.com/machine_spec),
    which its billing export writes on a machine's core, memory and GPU rows alike."""
    for column in MACHINE_COLUMNS:
        machine = _label(row.get(column), GCP_MACHINE)
        if machine:
            return machine.strip()
    return None


def _no_instance(row: dict) -> str:
    """Where costlab looked for a row's instance type and found none: the columns of
    INSTANCE_COLUMNS the file has, or that it has none of them (a file may name only ResourceId and
    SkuId, neither an instance type); with the row's ServiceCategory, so that a database's or a
    function's hours are a group apart from compute instances'."""
    category = f"ServiceCategory {row.get('ServiceCategory') or 'empty'}"
    looked = [f"{column} ({what})" for column, what in INSTANCE_COLUMNS if column in row]
    if not looked:
        every = ", ".join(f"{column} ({what})" for column, what in INSTANCE_COLUMNS)
        return f"{category}; the file has no column that names one: {every}"
    return f"{category}; none named in {', '.join(looked)}"


# --- a machine billed per component ------------------------------------------------------------


@dataclass(frozen=True)
class Component:
    """One kind of a machine's components: how a row of it is measured and how much of it one
    instance of a catalogue type holds (the Instance attribute)."""

    kind: str
    label: str
    unit: str
    attribute: str
    details: tuple[str, ...]  # its FOCUS-defined SkuPriceDetails property, per pricing unit
    noun: str  # what one instance holds of it

    def per_instance(self, instance: Instance) -> Decimal:
        return Decimal(getattr(instance, self.attribute))


COMPONENTS = {
    c.kind: c
    for c in (
        Component("cores", "cores", "vCPU-hours", "vcpus", ("CoreCount", "F_CoreCount"), "vCPUs"),
        Component(
            "memory", "memory", "GiB-hours", "memory_gib", ("MemorySize", "F_MemorySize"), "GiB"
        ),
        Component("gpus", "GPUs", "GPU-hours", "gpu_count", ("GpuCount", "F_GpuCount"), "GPUs"),
    )
}


def measure_of(instance: Instance) -> Component:
    """The component whose hours are a machine's instance-hours: its GPUs (what costlab prices per
    GPU-hour), a CPU machine's cores."""
    return COMPONENTS["gpus" if instance.gpu_count else "cores"]


# Google Cloud's SKU descriptions: "N2 Instance Core running in Americas", "A3 Instance Ram running
# in Americas", "Nvidia H100 80GB GPU running in Americas" (cores before memory: "Memory-optimized
# Instance Core" is M1's cores); a licence's fee ("... (CPU cost)") or a commitment's is no
# component of the machine.
_DESCRIBED = (
    ("gpus", re.compile(r"\bgpus?\b", re.IGNORECASE)),
    ("cores", re.compile(r"\b(?:cores?|vcpus?)\b", re.IGNORECASE)),
    ("memory", re.compile(r"\b(?:ram|memory)\b", re.IGNORECASE)),
)
_NOT_A_COMPONENT = re.compile(r"licen[cs]|commitment", re.IGNORECASE)

NO_MACHINE = "machine component without its machine type"
UNKNOWN_MACHINE = "machine type not in the catalogue (priced per component)"
UNKNOWN_COMPONENT = "machine component costlab cannot place (unknown component or unit)"
NOT_IN_MACHINE = "component the catalogue's machine type has none of"
NO_MEASURE = "machine components without their measure (no instance-hours)"


def _description(row: dict) -> str:
    """The row's SKU description: ChargeDescription, else the one of Google's sku column (carried
    over by focus-converter, which leaves ChargeDescription empty), else x_SkuDescription."""
    for value in (
        row.get("ChargeDescription"),
        _mapping(row.get("sku")).get("description"),
        row.get("x_SkuDescription"),
    ):
        if value and str(value).strip():
            return str(value).strip()
    return ""


def _described(row: dict, unit: str) -> str | None:
    """The component a row's SKU description names (cores, memory, GPUs), or, with none named, a
    GiB-hour unit's memory; None where it names none (or a licence's or commitment's fee)."""
    text = _description(row)
    if _NOT_A_COMPONENT.search(text):
        return None
    for kind, pattern in _DESCRIBED:
        if pattern.search(text):
            return kind
    return "memory" if unit == UNIT_GIB_HOURS else None


def _google_compute(row: dict) -> bool:
    """A row of Google Cloud's Compute Engine, which bills a machine's cores, memory and GPUs as
    SKUs of their own."""
    provider = " ".join(
        str(row.get(c) or "") for c in ("ProviderName", "Provider", "ServiceProviderName")
    )
    return "google" in provider.lower() and str(row.get("ServiceName") or "").strip().lower() in (
        "compute engine",
        "",
    )


@dataclass(frozen=True)
class Part:
    """A component row of a machine: its component and how many of the component's units one
    pricing unit holds (FOCUS's SkuPriceDetails property, else 1: a core's hour is a vCPU-hour)."""

    component: Component
    per_unit: Decimal


def _part(row: dict, instance: Instance, unit: str, labelled: bool) -> tuple[Part | None, str, str]:
    """(part, reason, detail): the component a row of a catalogue type prices, None for a whole
    instance-hour, or why a component cannot be placed. A row of Google Cloud's Compute Engine is a
    component where the type is named only in its labels, where its unit is GiB-hours, where its
    SkuPriceDetails' GpuCount, CoreCount or MemorySize (FOCUS: per pricing unit) is not the
    type's, or where its description names one. Another provider's row whose SkuPriceDetails'
    count is not the type's is left out: what its counts measure is the provider's to say."""
    details = _mapping(row.get("SkuPriceDetails"))
    stated: dict[str, Decimal] = {}
    keys: dict[str, str] = {}
    for component in COMPONENTS.values():
        key = next((k for k in component.details if k in details), None)
        if key is None:
            continue
        try:
            stated[component.kind] = Decimal(str(details[key]))
        except InvalidOperation:
            return None, "not a number", f"SkuPriceDetails {key}: {str(details[key])[:20]!r}"
        keys[component.kind] = key
    differs = [k for k, said in stated.items() if said != COMPONENTS[k].per_instance(instance)]
    if not (labelled or _google_compute(row)):
        if differs:
            kind = differs[0]
            whole = COMPONENTS[kind].per_instance(instance)
            return (
                None,
                "priced per component, not per instance-hour",
                f"SkuPriceDetails {keys[kind]} {stated[kind]} of {instance.key}'s {whole}",
            )
        return None, "", ""  # a whole instance-hour (in another unit: left out by its unit)
    described = _described(row, unit)
    if not labelled and not differs and unit == UNIT_HOURS and described is None:
        return None, "", ""  # a whole instance-hour
    if unit == UNIT_GIB_HOURS:
        kind = "memory" if described in (None, "memory") else None
    else:
        kind = described or next((k for k in differs if stated[k]), None)
    if kind is None:
        said = _description(row)[:80] or "no description"
        return None, UNKNOWN_COMPONENT, f"{instance.key}: {said}, in {unit}"
    component = COMPONENTS[kind]
    if component.per_instance(instance) == 0:
        return None, NOT_IN_MACHINE, f"{component.label} of {instance.key}"
    if unit == UNIT_GIB_HOURS:
        per_unit = Decimal(1)
    elif kind == "memory":  # memory by the hour: only with the GiB one pricing unit holds
        per_unit = stated.get("memory") or ZERO
        if not per_unit:
            said = _description(row)[:80] or "no description"
            return None, UNKNOWN_COMPONENT, f"{instance.key}: {said}, in hours with no MemorySize"
    else:
        per_unit = stated.get(kind) or Decimal(1)
    return Part(component, per_unit), "", ""


def _instance(
    row: dict, known: dict[str, Instance], unit: str = UNIT_HOURS
) -> tuple[Instance | None, Part | None, str, str]:
    """(instance, part, reason, detail): the row's instance and, for a component row, the
    component it prices; or why it has none."""
    resource = row.get("x_CostlabResource")
    if resource:  # costlab's own allocation: one GPU-hour of a SKU, or one vCPU-hour
        sku = str(row.get("x_CostlabGpuSku") or "")
        if resource == "gpu-hours" and sku:
            return Instance(f"costlab:{sku}", "costlab", sku, 1, 0), None, "", ""
        if resource == "vcpu-hours":
            return Instance("costlab:vcpu", "costlab", "", 0, 1), None, "", ""
        return None, None, "no resource priced", f"x_CostlabResource {resource}"
    name = instance_name(row)
    labelled = name is None
    if labelled:  # Google Cloud names the machine in its labels, on each of its components' rows
        name = _machine_spec(row)
        if name is None:
            kind = _described(row, unit) if _google_compute(row) else None
            if kind is not None:
                looked = [
                    f"{column} ({what})" for column, what in INSTANCE_COLUMNS if column in row
                ]
                looked += [
                    f"{column} ({GCP_MACHINE})" for column in MACHINE_COLUMNS if column in row
                ]
                said = f"none named in {', '.join(looked)}" if looked else "no column names one"
                return None, None, NO_MACHINE, f"{COMPONENTS[kind].label}: {said}"
            return None, None, "no instance type", _no_instance(row)
    found = known.get(name.lower()) or known.get(f"standard_{name.lower()}")
    if found is None:
        if labelled:
            return None, None, UNKNOWN_MACHINE, f"{name} ({GCP_MACHINE})"
        return None, None, "unknown instance type", name
    part, reason, detail = _part(row, found, unit, labelled)
    if reason:
        return None, None, reason, detail
    return found, part, "", ""


@dataclass
class _Aggregate:
    instance: Instance
    rows: int = 0
    hours: Decimal = Decimal("0")
    effective: Decimal = Decimal("0")
    billed: Decimal = Decimal("0")
    listed: Decimal = Decimal("0")
    listed_hours: Decimal = Decimal("0")  # of the rows with a ListCost
    unlisted_rows: int = 0  # rows with no ListCost
    consumed_rows: int = 0  # rows with no PricingUnit, read by their ConsumedQuantity
    committed_hours: Decimal = Decimal("0")
    # a machine billed per component (_components_priced): its rows, each component's sums, the
    # component whose hours are its instance-hours, and the components that do not agree with it
    component_rows: int = 0
    components: dict[str, dict] = field(default_factory=dict)
    measure: str | None = None
    disagreements: list[str] = field(default_factory=list)

    def derived(self) -> str:
        if not self.components:
            return "from instance-hours"
        parts = ", ".join(COMPONENTS[k].label for k in COMPONENTS if k in self.components)
        whole = "instance-hours and " if self.rows > self.component_rows else ""
        return f"from {whole}components: {parts}"

    def shown(self) -> dict:
        inst = self.instance
        per_hour = self.effective / self.hours
        return {
            "instance_type": inst.key,
            "provider": inst.provider,
            "gpu_sku": inst.gpu_sku or None,
            "gpu_count": inst.gpu_count,
            "vcpus": inst.vcpus,
            "memory_gib": _plain(inst.memory_gib),
            "derived": self.derived(),
            "components": self.components,
            "component_measure": self.measure,
            "component_disagreements": self.disagreements,
            "rows": self.rows,
            "hours": _text(self.hours),
            "commitment_hours": _text(self.committed_hours),
            "effective_cost": _text(self.effective),
            "billed_cost": _text(self.billed),
            "list_cost": _text(self.listed),
            "effective_hourly": _text(per_hour),
            "list_hourly": _text(self.listed / self.listed_hours) if self.listed_hours else None,
            "rows_without_list_cost": self.unlisted_rows,
            "rows_hours_from_consumed_quantity": self.consumed_rows,
            "effective_per_gpu_hour": _text(per_hour / inst.gpu_count) if inst.gpu_count else None,
            "effective_per_vcpu_hour": None if inst.gpu_count else _text(per_hour / inst.vcpus),
        }


@dataclass
class _ComponentSum:
    """A machine type's rows of one of its components, summed."""

    rows: int = 0
    quantity: Decimal = ZERO  # in the component's unit: vCPU-, GiB- or GPU-hours
    effective: Decimal = ZERO
    billed: Decimal = ZERO
    listed: Decimal = ZERO
    unlisted_rows: int = 0
    consumed_rows: int = 0
    committed: Decimal = ZERO  # the quantity a commitment covered


@dataclass
class _Machine:
    """A machine type's component rows, summed per component: memory is the number of types
    billed per component, not of rows."""

    instance: Instance
    parts: dict[str, _ComponentSum] = field(default_factory=dict)
    rows: int = 0
    row_numbers: list[int] = field(default_factory=list)

    def add(self, number: int, part: Part) -> _ComponentSum:
        self.rows += 1
        if len(self.row_numbers) < ROWS_LISTED:
            self.row_numbers.append(number)
        sums = self.parts.get(part.component.kind)
        if sums is None:
            sums = self.parts[part.component.kind] = _ComponentSum()
        sums.rows += 1
        return sums


def _plain(value: Decimal) -> str:
    """A quantity as plain text: to the micro, no trailing zeros, no exponent."""
    text = format(_money(Decimal(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def usage_label(key: str) -> str:
    """FocusUsage's instance type for a machine's component rows."""
    return f"{key} (components)"


@dataclass
class _Skipped:
    reason: str
    detail: str
    rows: int = 0
    row_numbers: list[int] = field(default_factory=list)
    cost: dict[str, Decimal] = field(default_factory=dict)  # EffectiveCost by currency

    def add(self, number: int, currency: str, cost: Decimal | None) -> None:
        self.rows += 1
        if len(self.row_numbers) < ROWS_LISTED:
            self.row_numbers.append(number)
        if cost is not None:
            self.cost[currency] = self.cost.get(currency, Decimal("0")) + cost

    def shown(self) -> dict:
        return {
            "reason": self.reason,
            "detail": self.detail,
            "rows": self.rows,
            "row_numbers": self.row_numbers,
            "row_numbers_complete": self.rows <= ROWS_LISTED,
            "effective_cost": {c: _text(v) for c, v in sorted(self.cost.items())},
        }


@dataclass
class Reading:
    """What a FOCUS file gives: the aggregates per instance type and the rows left out."""

    version: str
    rows: int = 0
    account: str | None = None
    currency: str | None = None
    aggregates: dict[str, _Aggregate] = field(default_factory=dict)
    components: dict[str, _Machine] = field(default_factory=dict)  # machines billed per component
    skipped: dict[tuple[str, str], _Skipped] = field(default_factory=dict)
    invoices: set[str] = field(default_factory=set)
    period: list[str] = field(default_factory=lambda: ["", ""])

    def skip(self, number: int, reason: str, detail: str, row: dict) -> None:
        group = self.skipped.get((reason, detail))
        if group is None:
            group = self.skipped[(reason, detail)] = _Skipped(reason, detail)
        try:
            cost = _decimal(row, "EffectiveCost")
        except ValueError:
            cost = None
        group.add(number, str(row.get("BillingCurrency") or ""), cost)

    def skip_counted(self, reason: str, detail: str, machine: _Machine, cost: Decimal) -> None:
        """A machine's component rows, read and summed, left out at the file's end."""
        group = self.skipped.get((reason, detail))
        if group is None:
            group = self.skipped[(reason, detail)] = _Skipped(reason, detail)
        group.rows += machine.rows
        group.row_numbers = sorted(group.row_numbers + machine.row_numbers)[:ROWS_LISTED]
        currency = self.currency or ""
        group.cost[currency] = group.cost.get(currency, ZERO) + cost

    def skipped_shown(self) -> list[dict]:
        return [g.shown() for g in sorted(self.skipped.values(), key=lambda g: -g.rows)]


def focus_read(
    stream: IO[bytes],
    *,
    known: dict[str, Instance],
    billing_account: str | None = None,
    currency: str | None = None,
    focus_version: str | None = None,
    usage: UsageSink | None = None,
) -> Reading:
    """Read a FOCUS cost-and-usage file (CSV or Parquet): refused whole (ApplicationError) for a
    missing mandatory column or an unknown version; otherwise aggregated per instance type, every
    row left out grouped by its reason. `billing_account` and `currency`: the rows to read (default:
    those of the first hourly usage row; the others are left out and listed). `usage`: where each
    counted row's cost and hours go per resource and day."""
    table = _Table(stream)
    try:
        columns = table.columns
        wanted = [c for c in (*_MANDATORY, *MANDATORY["1.3"], *OPTIONAL) if c in columns]
        rows = table.rows(list(dict.fromkeys(wanted)))
        first = next(rows, None)
        version = _version(columns, focus_version, None if first is None else first[0])
        _refuse_missing(columns, version)
        reading = Reading(version=version, account=billing_account, currency=currency)
        seen: set[bytes] = set()
        if first is not None:
            _read_row(reading, 1, *first, known, seen, usage)
        for number, (row, whole) in enumerate(rows, start=2):
            _read_row(reading, number, row, whole, known, seen, usage)
        _components_priced(reading, usage)
        return reading
    finally:
        table.release()


def _read_row(
    reading: Reading,
    number: int,
    row: dict,
    whole: Any,
    known: dict[str, Instance],
    seen: set[bytes],
    usage: UsageSink | None = None,
) -> None:
    """One row, summed or left out with the first of its reasons, checked in this order."""
    reading.rows += 1
    charge = _charge_skipped(row)
    if charge is not None:
        reading.skip(number, *charge, row)
        return
    quantity_column, unit_column = _quantity_columns(row)
    unit = str(row.get(unit_column) or "")
    unit_kind = _unit_kind(unit)
    non_hourly = ("non-hourly unit", f"{unit_column} {unit or 'empty'}")
    if unit_kind is None:
        reading.skip(number, *non_hourly, row)
        return
    instance, part, reason, detail = _instance(row, known, unit_kind)
    if unit_kind == UNIT_GIB_HOURS and part is None and reason not in COMPONENT_REASONS:
        reading.skip(number, *non_hourly, row)  # GiB-hours: only a machine's memory is read
        return
    if instance is None:
        reading.skip(number, reason, detail, row)
        return
    other = _other_account(reading, row)
    if other is not None:
        reading.skip(number, *other, row)
        return
    amounts, reason, detail = _amounts(row, quantity_column)
    if amounts is None:
        reading.skip(number, reason, detail, row)
        return
    if _repeated(whole, seen):
        reading.skip(number, "duplicate row", "the same row as an earlier one", row)
        return
    if part is not None:  # one component of a machine: summed per type and component
        _component_add(reading, number, row, instance, part, amounts, usage)
    else:
        _instance_add(reading, row, instance, amounts, usage)
    _invoice_and_period(reading, row)


def _charge_skipped(row: dict) -> tuple[str, str] | None:
    """(reason, detail) for a charge that is no usage: not Usage, a correction, unused, or None."""
    category = str(row.get("ChargeCategory") or "")
    if category != "Usage":
        reason = {
            "Tax": "tax",
            "Credit": "credit",
            "Adjustment": "adjustment",
            "Purchase": "purchase (a commitment's fee: its amortised share is in the usage rows' "
            "EffectiveCost)",
        }.get(category, "not a usage charge")
        return reason, f"ChargeCategory {category or 'empty'}"
    if row.get("ChargeClass") == "Correction":
        return "correction of an earlier period", "ChargeClass Correction"
    unused = row.get("ChargeType") in UNUSED_CHARGE_TYPES  # Azure's, carried over
    if row.get("CommitmentDiscountStatus") == "Unused" or unused:
        return (
            "unused commitment (no instance's usage)",
            f"ChargeType {row['ChargeType']}" if unused else "CommitmentDiscountStatus Unused",
        )
    return None


def _quantity_columns(row: dict) -> tuple[str, str]:
    """The row's quantity and unit columns: its pricing ones, else with neither its consumed."""
    quantity_column, unit_column = "PricingQuantity", "PricingUnit"
    pricing = (row.get("PricingUnit"), row.get("PricingQuantity"))
    if pricing == (None, None) and row.get("ConsumedUnit") is not None:
        # no pricing unit at all (focus-converter leaves Azure's empty): the consumed hours
        quantity_column, unit_column = "ConsumedQuantity", "ConsumedUnit"
    return quantity_column, unit_column


def _other_account(reading: Reading, row: dict) -> tuple[str, str] | None:
    """(reason, detail) for another account or currency than the one read (the first's), or None."""
    for column, attribute, reason in (
        ("BillingAccountId", "account", "other billing account"),
        ("BillingCurrency", "currency", "other currency"),
    ):
        value = str(row.get(column) or "")
        if getattr(reading, attribute) is None:  # the first hourly usage row's is the one read
            setattr(reading, attribute, value)
        if value != getattr(reading, attribute):
            return reason, f"{column} {value or 'empty'} (reading {getattr(reading, attribute)})"
    return None


@dataclass(frozen=True)
class _Amounts:
    """What a counted row adds: its quantity and costs, and how its hours were read."""

    quantity: Decimal
    effective: Decimal
    listed: Decimal | None
    billed: Decimal | None
    consumed: bool  # its hours are its ConsumedQuantity (no PricingUnit)
    committed: bool  # CommitmentDiscountStatus Used


def _amounts(row: dict, quantity_column: str) -> tuple[_Amounts | None, str, str]:
    """(amounts, reason, detail): the row's quantity and costs, or why they price no hours."""
    try:
        quantity = _decimal(row, quantity_column)
        effective = _decimal(row, "EffectiveCost")
        listed = _decimal(row, "ListCost")
        billed = _decimal(row, "BilledCost")
    except ValueError as exc:
        return None, "not a number", str(exc)
    if effective is None:
        return None, "no cost", "EffectiveCost empty"
    if quantity is None or quantity == 0:
        return None, "zero quantity", f"{quantity_column} 0 or empty"
    if quantity < 0:
        return (
            None,
            "negative quantity (a refund or correction, not a price)",
            f"{quantity_column} {quantity}",
        )
    for column, value in (("EffectiveCost", effective), ("BilledCost", billed)):
        if value is not None and value < 0:  # as AWS's SavingsPlanNegation, a discount's line
            return (
                None,
                "negative cost of hours (a negation or discount, not a price)",
                f"{column} {value}",
            )
    if effective == 0 and row.get("CommitmentDiscountId"):
        return (
            None,
            "commitment-covered hours at EffectiveCost 0 (not amortised: a cost export "
            "without the commitment's share)",
            f"CommitmentDiscountId {str(row['CommitmentDiscountId'])[:80]}",
        )
    amounts = _Amounts(
        quantity=quantity,
        effective=effective,
        listed=listed,
        billed=billed,
        consumed=quantity_column == "ConsumedQuantity",
        committed=row.get("CommitmentDiscountStatus") == "Used",
    )
    return amounts, "", ""


def _repeated(whole: Any, seen: set[bytes]) -> bool:
    """Whether the whole row was read before (its digest seen); a new row's digest is kept."""
    whole = sorted(whole.items()) if isinstance(whole, dict) else whole
    digest = hashlib.blake2b(repr(whole).encode(), digest_size=DIGEST_BYTES).digest()
    if digest in seen:
        return True
    seen.add(digest)
    return False


def _component_add(
    reading: Reading,
    number: int,
    row: dict,
    instance: Instance,
    part: Part,
    amounts: _Amounts,
    usage: UsageSink | None,
) -> None:
    """A machine's component row, summed per machine type and component (and into usage)."""
    machine = reading.components.get(instance.key)
    if machine is None:
        machine = reading.components[instance.key] = _Machine(instance)
    sums = machine.add(number, part)
    amount = amounts.quantity * part.per_unit
    sums.quantity += amount
    sums.effective += amounts.effective
    sums.billed += amounts.billed or ZERO
    if amounts.listed is None:
        sums.unlisted_rows += 1
    else:
        sums.listed += amounts.listed
    if amounts.consumed:
        sums.consumed_rows += 1
    if amounts.committed:
        sums.committed += amount
    if usage is not None:  # the measure's rows hold the hours; every component its cost
        measure = measure_of(instance)
        hours = amount / measure.per_instance(instance) if part.component is measure else ZERO
        usage.add(row, instance, hours, amounts.effective, label=usage_label(instance.key))


def _instance_add(
    reading: Reading,
    row: dict,
    instance: Instance,
    amounts: _Amounts,
    usage: UsageSink | None,
) -> None:
    """A row of whole instance-hours, summed per instance type (and into usage)."""
    quantity = amounts.quantity
    aggregate = reading.aggregates.get(instance.key)
    if aggregate is None:
        aggregate = reading.aggregates[instance.key] = _Aggregate(instance)
    aggregate.rows += 1
    aggregate.hours += quantity
    aggregate.effective += amounts.effective
    if amounts.listed is None:  # FOCUS's ListCost is mandatory; a converter may leave it empty
        aggregate.unlisted_rows += 1
    else:
        aggregate.listed += amounts.listed
        aggregate.listed_hours += quantity
    if amounts.consumed:
        aggregate.consumed_rows += 1
    aggregate.billed += amounts.billed or Decimal("0")
    if amounts.committed:
        aggregate.committed_hours += quantity
    if usage is not None:
        usage.add(row, instance, quantity, amounts.effective)


def _invoice_and_period(reading: Reading, row: dict) -> None:
    """A counted row's invoice (up to 20 kept) and billing period, noted on the reading."""
    invoice = row.get("InvoiceId") or row.get("bill/InvoiceId") or row.get("bill_invoice_id")
    if invoice and len(reading.invoices) < 20:
        reading.invoices.add(str(invoice))
    start, end = _day(row.get("BillingPeriodStart")), _day(row.get("BillingPeriodEnd"))
    if start and (not reading.period[0] or start < reading.period[0]):
        reading.period[0] = start
    if end and end > reading.period[1]:
        reading.period[1] = end


def _unit_kind(unit: str) -> str | None:
    """Hours, GiB-hours (a machine's memory, as Google Cloud bills it) or neither."""
    said = " ".join(unit.strip().lower().replace("-", " ").replace("_", " ").split())
    if said in HOURS:
        return UNIT_HOURS
    if said in GIB_HOURS or said.rstrip("s") in GIB_HOURS:
        return UNIT_GIB_HOURS
    return None


COMPONENT_REASONS = {NO_MACHINE, UNKNOWN_MACHINE, UNKNOWN_COMPONENT, NOT_IN_MACHINE}


def _components_priced(reading: Reading, usage: UsageSink | None) -> None:
    """Each machine type billed per component becomes instance-hours at the sum of its components'
    costs. Its instance-hours are its measure's (GPU-hours over its GPUs; a CPU machine's vCPU-hours
    over its vCPUs); each other component's hours over its quantity in one instance (GiB-hours
    over its memory) are checked against them, and a component that differs by more than
    COMPONENT_TOLERANCE, or that has no rows, is listed (its cost, or its absence, is in the price
    as billed). A type with no rows of its measure has no instance-hours: its component rows are
    left out, listed, and their usage taken back."""
    for key, machine in sorted(reading.components.items()):
        inst = machine.instance
        measure = measure_of(inst)
        measured = machine.parts.get(measure.kind)
        parts = [(COMPONENTS[k], machine.parts[k]) for k in COMPONENTS if k in machine.parts]
        effective = sum((sums.effective for _, sums in parts), ZERO)
        if measured is None:
            _measure_missing(reading, key, machine, parts, effective, usage)
            continue
        hours = measured.quantity / measure.per_instance(inst)
        shown, disagreements = _components_compared(key, machine, parts, hours)
        aggregate = reading.aggregates.get(key)
        if aggregate is None:
            aggregate = reading.aggregates[key] = _Aggregate(inst)
        _components_summed(aggregate, machine, parts, hours, effective)
        aggregate.committed_hours += measured.committed / measure.per_instance(inst)
        aggregate.components = shown
        aggregate.measure = measure.label
        aggregate.disagreements = disagreements


def _measure_missing(
    reading: Reading,
    key: str,
    machine: _Machine,
    parts: list[tuple[Component, _ComponentSum]],
    effective: Decimal,
    usage: UsageSink | None,
) -> None:
    """A machine type with no rows of its measure: its component rows left out, usage taken back."""
    inst = machine.instance
    measure = measure_of(inst)
    read = ", ".join(component.label for component, _ in parts)
    reading.skip_counted(
        NO_MEASURE,
        f"{key}: no {measure.unit} rows ({measure.unit} over the "
        f"{_plain(measure.per_instance(inst))} {measure.noun} one holds are its "
        f"instance-hours); read: {read}",
        machine,
        effective,
    )
    if usage is not None:
        usage.discard(usage_label(key))


def _components_compared(
    key: str,
    machine: _Machine,
    parts: list[tuple[Component, _ComponentSum]],
    hours: Decimal,
) -> tuple[dict, list[str]]:
    """(shown, disagreements): each component's sums, and those not agreeing with the measure."""
    inst = machine.instance
    measure = measure_of(inst)
    disagreements = []
    shown = {}
    for component, sums in parts:
        per = component.per_instance(inst)
        theirs = sums.quantity / per
        shown[component.kind] = {
            "rows": sums.rows,
            "quantity": _plain(sums.quantity),
            "unit": component.unit,
            "per_instance": _plain(per),
            "instance_hours": _plain(theirs),
            "effective_cost": _text(sums.effective),
            "list_cost": _text(sums.listed),
        }
        apart = abs(theirs - hours) / hours
        if component is not measure and apart > COMPONENT_TOLERANCE:
            disagreements.append(
                f"{component.label}: {_plain(sums.quantity)} {component.unit} over "
                f"{_plain(per)} are {_plain(theirs)} instance-hours, its {measure.label} give "
                f"{_plain(hours)} ({_plain(apart * 100)}% apart)"
            )
    for component in COMPONENTS.values():
        if component.kind not in machine.parts and component.per_instance(inst):
            disagreements.append(
                f"{component.label}: no rows (one {key} holds "
                f"{_plain(component.per_instance(inst))} {component.noun}); "
                "their cost is not in the price"
            )
    return shown, disagreements


def _components_summed(
    aggregate: _Aggregate,
    machine: _Machine,
    parts: list[tuple[Component, _ComponentSum]],
    hours: Decimal,
    effective: Decimal,
) -> None:
    """A machine type's component sums, added to its aggregate as instance-hours and costs."""
    unlisted = sum(sums.unlisted_rows for _, sums in parts)
    aggregate.rows += machine.rows
    aggregate.component_rows = machine.rows
    aggregate.hours += hours
    aggregate.effective += effective
    aggregate.billed += sum((sums.billed for _, sums in parts), ZERO)
    aggregate.unlisted_rows += unlisted
    if not unlisted:  # the list price of some of a machine's components is no machine's
        aggregate.listed += sum((sums.listed for _, sums in parts), ZERO)
        aggregate.listed_hours += hours
    aggregate.consumed_rows += sum(sums.consumed_rows for _, sums in parts)


# --- usage per resource and day, for reconciliation --------------------------------------------


def _moment(value: Any) -> datetime | None:
    """A FOCUS datetime (ISO 8601 text, or a Parquet timestamp or date) in UTC; None if it is
    none."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif value is None or str(value).strip() == "":
        return None
    else:
        try:
            moment = datetime.fromisoformat(str(value).strip())
        except ValueError:
            return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _day_parts(start: datetime, end: datetime | None) -> list[tuple[date, Decimal]]:
    """The UTC days of a charge period with each one's share of its time (shares sum to 1); a
    period that ends at or before its start, has no end or spans more than SPLIT_DAYS_MAX days
    (no usage row does: a stamp gone wrong) is its start's day."""
    if end is None or end <= start or end - start > timedelta(days=SPLIT_DAYS_MAX):
        return [(start.date(), Decimal(1))]
    total = Decimal(int((end - start).total_seconds() * 1_000_000))
    parts = []
    moment = start
    while moment < end:
        midnight = datetime(moment.year, moment.month, moment.day, tzinfo=UTC) + timedelta(days=1)
        upto = min(midnight, end)
        parts.append((moment.date(), Decimal(int((upto - moment).total_seconds() * 1_000_000))))
        moment = upto
    return [(day, micros / total) for day, micros in parts]


class UsageSink:
    """A FOCUS import's counted rows summed per ResourceId, UTC day and instance type
    (EffectiveCost, instance-hours, GPU-hours, vCPU-hours): held up to USAGE_HELD sums, then written
    as FocusUsage records of the import, so memory stays flat whatever the file's length. A row
    across midnight is split by its time, the last day taking what rounding left, so the days add
    up to the row."""

    def __init__(self, record: FocusImport):
        self.record = record
        self.held: dict[tuple[str, date, str], list] = {}
        self.written = 0
        self.without_resource: dict[str, int] = {}  # per instance type (label)
        self.undated: dict[str, int] = {}

    def add(
        self,
        row: dict,
        instance: Instance,
        hours: Decimal,
        cost: Decimal,
        label: str | None = None,
    ) -> None:
        """A counted row's hours and cost, as `label` (default: its instance type)."""
        label = (label or instance.key)[:120]
        start = _moment(row.get("ChargePeriodStart"))
        if start is None:  # a mandatory column, yet unreadable: priced, but on no day
            self.undated[label] = self.undated.get(label, 0) + 1
            return
        resource = str(row.get("ResourceId") or "").strip()
        if not resource:
            self.without_resource[label] = self.without_resource.get(label, 0) + 1
        parts = _day_parts(start, _moment(row.get("ChargePeriodEnd")))
        hours_left, cost_left = hours, cost
        for index, (day, share) in enumerate(parts):
            if index == len(parts) - 1:
                part_hours, part_cost = hours_left, cost_left
            else:
                part_hours = (hours * share).quantize(USAGE_PLACES, rounding=ROUND_HALF_UP)
                part_cost = (cost * share).quantize(USAGE_PLACES, rounding=ROUND_HALF_UP)
                hours_left -= part_hours
                cost_left -= part_cost
            sums = self.held.get((resource, day, label))
            if sums is None:
                if len(self.held) >= USAGE_HELD:
                    self.flush()
                sums = self.held[(resource, day, label)] = [ZERO, ZERO, ZERO, ZERO, 0]
            sums[0] += part_hours
            sums[1] += part_hours * instance.gpu_count
            sums[2] += part_hours * instance.vcpus
            sums[3] += part_cost
            sums[4] += 1

    def flush(self) -> None:
        FocusUsage.objects.bulk_create(
            (
                FocusUsage(
                    focus_import=self.record,
                    resource_id=resource,
                    day=day,
                    instance_type=key,
                    hours=hours,
                    gpu_hours=gpu_hours,
                    vcpu_hours=vcpu_hours,
                    effective_cost=cost,
                    rows=rows,
                )
                for (resource, day, key), (hours, gpu_hours, vcpu_hours, cost, rows) in (
                    self.held.items()
                )
            ),
            batch_size=1000,
        )
        self.written += len(self.held)
        self.held.clear()

    def discard(self, label: str) -> None:
        """Take back what was added as `label` (a machine's components that priced nothing)."""
        label = label[:120]
        for key in [k for k in self.held if k[2] == label]:
            del self.held[key]
        deleted, _ = FocusUsage.objects.filter(
            focus_import=self.record, instance_type=label
        ).delete()
        self.written -= deleted
        self.without_resource.pop(label, None)
        self.undated.pop(label, None)

    def shown(self) -> dict:
        return {
            "records": self.written,
            "rows_without_resource_id": sum(self.without_resource.values()),
            "rows_without_charge_period": sum(self.undated.values()),
        }


# --- prices ----------------------------------------------------------------------------------


@dataclass
class Derived:
    """The prices a reading gives: per GPU SKU per GPU-hour, per vCPU-hour."""

    gpu: dict[str, Decimal]
    vcpu_hour: Decimal | None
    sources: dict[str, list[str]]  # what each price came from ("gpu:<SKU>", "vcpu")

    def shown(self) -> dict:
        return {
            "gpu_prices": [
                {"sku": sku, "hourly_usd": _text(rate), "from": self.sources[f"gpu:{sku}"]}
                for sku, rate in sorted(self.gpu.items())
            ],
            "vcpu_hour_usd": _text(self.vcpu_hour),
            "vcpu_from": self.sources.get("vcpu", []),
            "memory_gb_hour_usd": "0.000000" if self.vcpu_hour is not None else None,
            "electricity_usd_per_kwh": "0.000000",
        }


def prices_derive(reading: Reading) -> Derived:
    gpu_cost: dict[str, Decimal] = {}
    gpu_hours: dict[str, Decimal] = {}
    cpu_cost, cpu_hours = Decimal("0"), Decimal("0")
    sources: dict[str, list[str]] = {}
    for key, agg in sorted(reading.aggregates.items()):
        inst = agg.instance
        if inst.gpu_count:
            gpu_cost[inst.gpu_sku] = gpu_cost.get(inst.gpu_sku, Decimal("0")) + agg.effective
            gpu_hours[inst.gpu_sku] = (
                gpu_hours.get(inst.gpu_sku, Decimal("0")) + agg.hours * inst.gpu_count
            )
            sources.setdefault(f"gpu:{inst.gpu_sku}", []).append(key)
        else:
            cpu_cost += agg.effective
            cpu_hours += agg.hours * inst.vcpus
            sources.setdefault("vcpu", []).append(key)
    return Derived(
        gpu={sku: _money(gpu_cost[sku] / gpu_hours[sku]) for sku in gpu_cost},
        vcpu_hour=_money(cpu_cost / cpu_hours) if cpu_hours else None,
        sources=sources,
    )


# --- the import ------------------------------------------------------------------------------


@dataclass
class ImportOutcome:
    record: FocusImport
    table: PricingTable | None
    created: bool  # a new version was made now
    already_imported: bool  # the same file was imported before: this is that import

    def shown(self) -> dict:
        r = self.record
        return {
            "id": r.pk,
            "sha256": r.sha256,
            "filename": r.filename,
            "focus_version": r.focus_version,
            "billing_account": r.billing_account,
            "currency": r.currency,
            "invoice_ids": r.invoice_ids,
            "period_start": r.period_start,
            "period_end": r.period_end,
            "rows": r.rows,
            "pricing_table": r.pricing_table_id,
            "created_version": r.created_version,
            "already_imported": self.already_imported,
            "derived": r.derived,
            "skipped": r.skipped,
            "created_at": r.created_at.isoformat(),
        }


def _gpu_skus(names: list[str]) -> dict[str, GpuSku]:
    """The GPU SKUs by name, created with the catalogue's figures where costlab has none."""
    specs = json.loads(CATALOGUE_FILE.read_text())["gpu_skus"]
    out = {}
    for name in names:
        sku = GpuSku.objects.filter(name=name).first()
        if sku is None:
            spec = specs.get(name)
            if spec is None:
                raise ApplicationError(
                    f"gpu_sku_name: no GPU SKU named {name!r} in costlab or the shipped "
                    "catalogue; add it (Pricing > GPU SKUs) or fix the instance type",
                    {"fields": {"gpu_sku_name": ["unknown SKU"]}},
                    code="invalid",
                )
            sku = GpuSku.objects.create(
                name=name,
                memory_gb=spec["memory_gb"],
                tdp_w=spec["tdp_w"],
                peak_bf16_tflops=Decimal(spec["peak_bf16_tflops"]),
            )
        out[name] = sku
    return out


def _name(reading: Reading) -> str:
    invoices = sorted(reading.invoices)
    said = ", ".join(invoices[:2]) + (f" +{len(invoices) - 2}" if len(invoices) > 2 else "")
    period = f"{reading.period[0]}..{reading.period[1]}" if reading.period[0] else "not stated"
    name = f"from invoice {said or '(no InvoiceId)'}, period {period}"
    return name[: PricingTable._meta.get_field("name").max_length]


@transaction.atomic
def pricing_table_import_focus(
    *,
    tenant: Tenant,
    stream: IO[bytes],
    filename: str = "",
    billing_account: str | None = None,
    currency: str | None = None,
    focus_version: str | None = None,
    skus_in_use: dict[int, tuple[str, int]] | None = None,
    confirm_unpriced: bool = False,
) -> ImportOutcome:
    """Import a FOCUS file into the tenant's prices as a new pricing table version from now (the
    pricing services' version of the table in force, or the tenant's first table), named for the
    invoice and period, and keep its usage per resource and day (FocusUsage) for billing's
    reconciliation. The same file again (SHA-256) answers with its first import. Nothing is
    stored when the file is refused (one transaction)."""
    sha256 = file_sha256(stream)
    existing = FocusImport.objects.filter(tenant=tenant, sha256=sha256).first()
    if existing is not None:
        return ImportOutcome(existing, existing.pricing_table, False, True)
    try:  # the record first: its usage is written as the file is read
        with transaction.atomic():
            record = FocusImport.objects.create(
                tenant=tenant, sha256=sha256, filename=filename[:255], usage_stored=True
            )
    except IntegrityError:  # the same file, imported at the same moment: that import stands
        existing = FocusImport.objects.get(tenant=tenant, sha256=sha256)
        return ImportOutcome(existing, existing.pricing_table, False, True)
    usage = UsageSink(record)
    reading = focus_read(
        stream,
        known=catalogue(),
        billing_account=billing_account,
        currency=currency,
        focus_version=focus_version,
        usage=usage,
    )
    _refuse_nothing_priced(reading)
    usage.flush()
    derived = prices_derive(reading)
    skus = _gpu_skus(sorted(derived.gpu))
    table, created = _version_make(
        tenant=tenant,
        reading=reading,
        derived=derived,
        skus=skus,
        sha256=sha256,
        filename=filename,
        skus_in_use=skus_in_use,
        confirm_unpriced=confirm_unpriced,
    )
    _record_save(record, reading, derived, usage, table, created)
    return ImportOutcome(record, table, created, False)


def _refuse_nothing_priced(reading: Reading) -> None:
    """A file with no hourly usage of a known instance type is refused, with its rows' reasons."""
    if not reading.aggregates:
        reasons = "; ".join(f"{g.rows} {g.reason} ({g.detail})" for g in reading.skipped.values())
        raise ApplicationError(
            f"file: no hourly usage of a known instance type to price ({reading.rows} rows"
            f"{': ' + reasons[:1500] if reasons else ''})",
            {"fields": {"file": ["nothing to price"]}, "skipped": reading.skipped_shown()},
            code="invalid",
        )


def _record_save(
    record: FocusImport,
    reading: Reading,
    derived: Derived,
    usage: UsageSink,
    table: PricingTable,
    created: bool,
) -> None:
    """The import's record, saved with what the file gave, the prices derived and the version."""
    record.focus_version = reading.version
    record.pricing_table = table
    record.created_version = created
    record.billing_account = (reading.account or "")[:255]
    record.currency = (reading.currency or "")[:3]
    record.invoice_ids = sorted(reading.invoices)
    record.period_start, record.period_end = reading.period
    record.rows = reading.rows
    record.derived = {
        "instance_types": [a.shown() for _, a in sorted(reading.aggregates.items())],
        "prices": derived.shown(),
        "component_disagreements": [
            f"{key}: {said}"
            for key, a in sorted(reading.aggregates.items())
            for said in a.disagreements
        ],
        "usage": usage.shown(),
    }
    record.skipped = reading.skipped_shown()
    record.save()


def _version_make(
    *,
    tenant: Tenant,
    reading: Reading,
    derived: Derived,
    skus: dict[str, GpuSku],
    sha256: str,
    filename: str,
    skus_in_use: dict[int, tuple[str, int]] | None,
    confirm_unpriced: bool,
) -> tuple[PricingTable, bool]:
    """The new version (pricing_table_update of the table in force: prices in force are never
    edited), or the tenant's first table. The invoice's GPU prices replace those SKUs' rates; the
    other SKUs keep theirs."""
    now = timezone.now()
    in_force = pricing_table_valid_at(tenant_id=tenant.pk, at=now)
    notes = (
        f"Derived from a FOCUS {reading.version} export ({filename or 'no file name'}, SHA-256 "
        f"{sha256}), billing account {reading.account}, {reading.currency}. Per instance type, "
        "EffectiveCost / PricingQuantity (a machine billed per component: its cores', memory's "
        "and GPUs' EffectiveCost over the instance-hours its GPU or core rows hold); a GPU-hour "
        "is an instance-hour over its GPUs; the vCPU price includes memory; electricity 0 (an "
        "instance-hour's price includes its power)."
    )
    fields: dict[str, Any] = {
        "name": _name(reading),
        "notes": notes,
        "currency": reading.currency or "USD",
        "electricity_usd_per_kwh": Decimal("0"),
    }
    if derived.vcpu_hour is not None:
        fields |= {"vcpu_hour_usd": derived.vcpu_hour, "memory_gb_hour_usd": Decimal("0")}
    rates = {} if in_force is None else services.gpu_rates(in_force)
    rates |= {skus[name].pk: rate for name, rate in derived.gpu.items()}
    by_pk = {s.pk: s for s in GpuSku.objects.filter(pk__in=rates)}
    gpu_prices = [{"sku": by_pk[pk], "hourly_usd": rate} for pk, rate in sorted(rates.items())]
    if in_force is None:
        table = services.pricing_table_create(
            tenant=tenant,
            valid_from=now,
            gpu_prices=gpu_prices,
            skus_in_use=skus_in_use,
            confirm_unpriced=confirm_unpriced,
            **fields,
        )
        return table, True
    priced = any(
        getattr(in_force, k) != v for k, v in fields.items() if k in services.PRICE_FIELDS
    ) or services.gpu_rates(in_force) != {pk: Decimal(r) for pk, r in rates.items()}
    if not priced:  # the invoice's prices are the version in force's: no version, nothing edited
        return in_force, False
    table = services.pricing_table_update(
        table=in_force,
        gpu_prices=gpu_prices,
        skus_in_use=skus_in_use,
        confirm_unpriced=confirm_unpriced,
        **fields,
    )
    return table, True
