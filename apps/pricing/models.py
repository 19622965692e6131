"""What resources cost: GPU SKUs, dated pricing tables, and cost models."""

from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from apps.core.models import TimeStampedModel
from apps.tenants.models import Tenant

NON_NEGATIVE = [MinValueValidator(Decimal("0"))]


def _money(**kwargs) -> models.DecimalField:
    return models.DecimalField(max_digits=14, decimal_places=6, validators=NON_NEGATIVE, **kwargs)


class GpuSku(TimeStampedModel):
    """An accelerator model that can be priced (e.g. NVIDIA H100 SXM 80GB)."""

    name = models.CharField(max_length=80, unique=True)
    vendor = models.CharField(max_length=40, default="NVIDIA")
    memory_gb = models.PositiveIntegerField("memory (GB)")
    tdp_w = models.PositiveIntegerField(
        "board power (W)", help_text="Board power limit (TDP), in watts."
    )
    peak_bf16_tflops = models.DecimalField(
        "dense BF16 peak (TFLOPS)",
        max_digits=8,
        decimal_places=1,
        validators=NON_NEGATIVE,
        help_text="Dense BF16 peak (TFLOPS), for MFU.",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU SKU"
        constraints = [
            models.CheckConstraint(
                condition=Q(peak_bf16_tflops__gte=0), name="gpusku_peak_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name


# A version valid from within this long before its creation is a version "from now" (an edit's
# new version, a table posted "from now" by a client's clock), not a retroactive one.
RETROACTIVE_AFTER = timedelta(seconds=1)


class PricingTable(TimeStampedModel):
    """Prices in force for one tenant from `valid_from` until the next table starts."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="pricing_tables")
    name = models.CharField(max_length=120)
    currency = models.CharField(max_length=3, default="USD")
    valid_from = models.DateTimeField()
    electricity_usd_per_kwh = _money(
        verbose_name="electricity (USD per kWh)", help_text="What the facility pays per kWh."
    )
    pue = models.DecimalField(
        "PUE",
        max_digits=4,
        decimal_places=2,
        default=Decimal("1.20"),
        validators=[MinValueValidator(Decimal("1"))],
        help_text="Power usage effectiveness: the facility's power over the IT equipment's (1.0 "
        "or more; 1.2 means cooling and the rest add 20 % to the energy a run uses).",
    )
    vcpu_hour_usd = _money(
        verbose_name="price per vCPU-hour (USD)",
        default=Decimal("0"),
        help_text="Price of one vCPU for one hour.",
    )
    memory_gb_hour_usd = _money(
        verbose_name="price per GB-hour of memory (USD)",
        default=Decimal("0"),
        help_text="Price of one GB of host memory for one hour.",
    )
    carbon_g_per_kwh = models.DecimalField(
        "grid carbon intensity (gCO2e per kWh)",
        max_digits=8,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="The region's grid intensity, versioned like the electricity price; empty: not "
        "known (a run's carbon is then marked unpriced, never 0).",
    )
    carbon_region = models.CharField(
        max_length=60, blank=True, default="", help_text="The grid region the intensity is of."
    )
    is_example = models.BooleanField(
        default=False, help_text="Example prices seeded for a demo; not a quote from any provider."
    )
    notes = models.TextField(blank=True)
    # A table in force is never edited in price: an edit makes a new version from the edit's time
    # that supersedes it (apps.pricing.services.pricing_table_update), so whatever was priced
    # with this row stays priced as it was.
    supersedes = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="superseded_by",
        help_text="The version this one replaced from its valid_from (a price edit).",
    )

    class Meta:
        ordering = ["tenant", "-valid_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "valid_from"], name="pricingtable_unique_tenant_valid_from"
            ),
            models.CheckConstraint(
                condition=Q(electricity_usd_per_kwh__gte=0), name="pricingtable_kwh_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(vcpu_hour_usd__gte=0), name="pricingtable_vcpu_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(memory_gb_hour_usd__gte=0), name="pricingtable_mem_non_negative"
            ),
            models.CheckConstraint(condition=Q(pue__gte=1), name="pricingtable_pue_at_least_one"),
        ]

    @property
    def retroactive(self) -> bool:
        """Valid from more than RETROACTIVE_AFTER before it was posted: it prices a run open
        when it was posted only from its creation, and a finished run only by an explicit,
        audited re-price (apps.pricing.selectors.effective_starts)."""
        return self.created_at is not None and self.created_at - self.valid_from > (
            RETROACTIVE_AFTER
        )

    def __str__(self) -> str:
        label = " (example prices)" if self.is_example else ""
        return f"{self.name}{label} from {self.valid_from:%Y-%m-%d}"


class GpuPrice(models.Model):
    pricing_table = models.ForeignKey(
        PricingTable, on_delete=models.CASCADE, related_name="gpu_prices"
    )
    sku = models.ForeignKey(GpuSku, on_delete=models.PROTECT, related_name="prices")
    hourly_usd = _money(
        verbose_name="price per GPU-hour (USD)", help_text="Price of one GPU for one hour."
    )

    class Meta:
        verbose_name = "GPU price"
        constraints = [
            models.UniqueConstraint(
                fields=["pricing_table", "sku"], name="gpuprice_unique_table_sku"
            ),
            models.CheckConstraint(
                condition=Q(hourly_usd__gte=0), name="gpuprice_hourly_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku}: {self.hourly_usd} USD/h"


class CostModel(TimeStampedModel):
    """How resource use becomes money; formulas live in billing (apps.billing.cost_engine)."""

    class Kind(models.TextChoices):
        RESOURCE_WEIGHTED = "resource_weighted", "Resource weighted"
        TIERED_PER_CALL = "tiered_per_call", "Tiered per unit of work"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="cost_models")
    name = models.CharField(max_length=120)
    kind = models.CharField(max_length=32, choices=Kind.choices, default=Kind.RESOURCE_WEIGHTED)
    gpu_weight = models.DecimalField(
        "weight of the GPU term",
        max_digits=8,
        decimal_places=4,
        default=Decimal("1"),
        validators=NON_NEGATIVE,
    )
    energy_weight = models.DecimalField(
        "weight of the energy term",
        max_digits=8,
        decimal_places=4,
        default=Decimal("1"),
        validators=NON_NEGATIVE,
    )
    cpu_weight = models.DecimalField(
        "weight of the vCPU term",
        max_digits=8,
        decimal_places=4,
        default=Decimal("1"),
        validators=NON_NEGATIVE,
    )
    memory_weight = models.DecimalField(
        "weight of the memory term",
        max_digits=8,
        decimal_places=4,
        default=Decimal("1"),
        validators=NON_NEGATIVE,
    )

    class Unit(models.TextChoices):
        TOKEN = "token", "Token"
        STEP = "step", "Optimizer step"

    unit = models.CharField(
        max_length=16,
        choices=Unit.choices,
        default=Unit.TOKEN,
        help_text="Unit of work priced by tiered_per_call.",
    )
    tiers = models.JSONField(
        default=list,
        blank=True,
        help_text='tiered_per_call only: [{"up_to": 1000000, "usd_per_unit": "0.000002"}, '
        '{"up_to": null, "usd_per_unit": "0.000001"}] in ascending order; the last tier is open.',
    )

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="costmodel_unique_tenant_name"),
            models.CheckConstraint(
                condition=Q(gpu_weight__gte=0)
                & Q(energy_weight__gte=0)
                & Q(cpu_weight__gte=0)
                & Q(memory_weight__gte=0),
                name="costmodel_weights_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def clean(self) -> None:
        if self.kind == self.Kind.TIERED_PER_CALL:
            validate_tiers(self.tiers)


def validate_tiers(tiers) -> None:
    """Tiers: a non-empty ascending list; every price >= 0; only the last tier is open."""
    if not isinstance(tiers, list) or not tiers:
        raise ValidationError(
            {"tiers": "tiered_per_call needs at least one tier: a list of {up_to, usd_per_unit}."}
        )
    previous = 0
    for i, tier in enumerate(tiers):
        if not isinstance(tier, dict) or set(tier) != {"up_to", "usd_per_unit"}:
            raise ValidationError(
                {"tiers": f"tier {i}: expected exactly the keys up_to and usd_per_unit."}
            )
        try:
            price = Decimal(str(tier["usd_per_unit"]))
        except Exception:
            raise ValidationError({"tiers": f"tier {i}: usd_per_unit is not a number."}) from None
        if price < 0:
            raise ValidationError({"tiers": f"tier {i}: usd_per_unit must be >= 0."})
        up_to = tier["up_to"]
        last = i == len(tiers) - 1
        if up_to is None:
            if not last:
                raise ValidationError(
                    {"tiers": f"tier {i}: only the last tier may be open (up_to null)."}
                )
            continue
        if not isinstance(up_to, int) or isinstance(up_to, bool) or up_to <= previous:
            raise ValidationError(
                {"tiers": f"tier {i}: up_to must be an integer above {previous}."}
            )
        previous = up_to


class InstanceType(TimeStampedModel):
    """A cloud instance type as costlab prices it: its GPUs (SKU and count), vCPUs and memory.

    The shipped catalogue (apps/pricing/catalogue/instance_types.json, its `version`) is seeded by
    a data migration and edited in the admin: a FOCUS import (apps.pricing.focus) maps an invoice's
    instance-hours onto GPU-hours and vCPU-hours through it."""

    class Provider(models.TextChoices):
        AWS = "aws", "AWS"
        AZURE = "azure", "Microsoft Azure"
        GCP = "gcp", "Google Cloud"
        OTHER = "other", "Other"

    provider = models.CharField(max_length=16, choices=Provider.choices)
    name = models.CharField(
        max_length=80,
        unique=True,
        help_text="As the provider writes it in its invoice (p5.48xlarge, "
        "Standard_ND96isr_H100_v5, a3-highgpu-8g); matched without regard to case.",
    )
    gpu_sku_name = models.CharField(
        "GPU SKU",
        max_length=80,
        blank=True,
        default="",
        help_text="The GPU SKU's name in costlab (empty: a CPU instance). An import prices this "
        "SKU; it is created with the catalogue's figures if costlab has none of that name.",
    )
    gpu_count = models.PositiveSmallIntegerField("GPUs", default=0)
    vcpus = models.PositiveIntegerField("vCPUs")
    memory_gib = models.DecimalField(
        "memory (GiB)", max_digits=8, decimal_places=1, validators=NON_NEGATIVE
    )
    catalogue_version = models.PositiveIntegerField(
        default=1, help_text="The shipped catalogue's version the row came from (0: added here)."
    )
    notes = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["provider", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_count=0, gpu_sku_name="")
                | (Q(gpu_count__gt=0) & ~Q(gpu_sku_name="")),
                name="instancetype_gpu_sku_with_gpus",
            ),
            models.CheckConstraint(condition=Q(vcpus__gt=0), name="instancetype_vcpus_positive"),
        ]

    def clean(self) -> None:
        if bool(self.gpu_count) != bool(self.gpu_sku_name):
            raise ValidationError(
                {"gpu_sku_name": "a GPU instance names its GPU SKU and count; a CPU one neither"}
            )

    def __str__(self) -> str:
        gpus = f"{self.gpu_count} x {self.gpu_sku_name}, " if self.gpu_count else ""
        return f"{self.name} ({gpus}{self.vcpus} vCPUs, {self.memory_gib} GiB)"


class FocusImport(models.Model):
    """One FOCUS cost-and-usage file imported into a tenant's prices (apps.pricing.focus): the
    file's SHA-256 (the same file again answers with this record, no second version), the version
    it made, and what it derived and skipped, with the reason."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="focus_imports")
    sha256 = models.CharField("SHA-256", max_length=64)
    filename = models.CharField(max_length=255, blank=True, default="")
    focus_version = models.CharField(max_length=16)
    pricing_table = models.ForeignKey(
        PricingTable,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="focus_imports",
        help_text="The version the import made (or the one in force, when its prices were those).",
    )
    created_version = models.BooleanField(
        default=True, help_text="False: the derived prices were those of the version in force."
    )
    billing_account = models.CharField(max_length=255)
    currency = models.CharField(max_length=3)
    invoice_ids = models.JSONField(default=list, blank=True)
    period_start = models.CharField(max_length=32, blank=True, default="")
    period_end = models.CharField(max_length=32, blank=True, default="")
    rows = models.PositiveBigIntegerField(default=0, help_text="Rows read.")
    derived = models.JSONField(default=dict, help_text="Prices derived, per instance type.")
    skipped = models.JSONField(default=list, help_text="Rows left out, grouped by reason.")
    usage_stored = models.BooleanField(
        default=False,
        help_text="Its usage per resource and day is kept (FocusUsage), for billing's "
        "reconciliation; False: imported before costlab kept it.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "FOCUS import"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "sha256"], name="focusimport_unique_tenant_sha256"
            )
        ]

    def __str__(self) -> str:
        return f"FOCUS import {self.sha256[:12]} ({self.filename or 'no name'})"


class FocusUsage(models.Model):
    """What an imported invoice billed one resource (its FOCUS ResourceId) on one UTC day, per
    instance type: the hourly usage rows the import counted (apps.pricing.focus), summed, a row
    across midnight split by its time. Billing's reconciliation (apps/billing/reconcile.py)
    compares costlab's runs on that resource that day with it. One (resource, day, instance type)
    may stand in several records (the import writes its sums in batches): read them summed."""

    focus_import = models.ForeignKey(FocusImport, on_delete=models.CASCADE, related_name="usage")
    resource_id = models.TextField(
        blank=True, default="", help_text="The rows' ResourceId; empty: the rows named none."
    )
    day = models.DateField(help_text="The UTC day of the rows' charge period.")
    instance_type = models.CharField(max_length=120)
    hours = models.DecimalField(
        max_digits=24, decimal_places=10, help_text="Instance-hours (PricingQuantity)."
    )
    gpu_hours = models.DecimalField(
        max_digits=24, decimal_places=10, help_text="Instance-hours x the type's GPUs."
    )
    vcpu_hours = models.DecimalField(
        max_digits=24, decimal_places=10, help_text="Instance-hours x the type's vCPUs."
    )
    effective_cost = models.DecimalField(max_digits=28, decimal_places=10)
    rows = models.PositiveIntegerField(default=0, help_text="Invoice rows summed.")

    class Meta:
        verbose_name = "FOCUS usage"
        verbose_name_plural = "FOCUS usage"
        indexes = [models.Index(fields=["focus_import", "day"], name="focususage_import_day")]

    def __str__(self) -> str:
        return f"{self.resource_id or 'no ResourceId'} {self.day} {self.instance_type}"
