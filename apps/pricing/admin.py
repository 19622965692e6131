from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone

from apps.pricing.models import (
    CostModel,
    FocusImport,
    GpuPrice,
    GpuSku,
    InstanceType,
    PricingTable,
)
from apps.pricing.services import (
    PRICE_FIELDS,
    PRICING_TABLE_FIELDS,
    gpu_rates,
    pricing_table_version_split,
)


@admin.register(GpuSku)
class GpuSkuAdmin(admin.ModelAdmin):
    list_display = ["name", "vendor", "memory_gb", "tdp_w", "peak_bf16_tflops"]
    search_fields = ["name", "vendor"]


class GpuPriceForm(forms.ModelForm):
    """A GPU at 0 USD/h is a choice, not a typo: it needs its box ticked, as the API needs
    confirm_free."""

    confirm_free = forms.BooleanField(
        required=False, label="free", help_text="Tick to save a price of 0: this GPU is free."
    )

    class Meta:
        model = GpuPrice
        fields = ["sku", "hourly_usd"]

    def clean(self):
        data = super().clean()
        if data.get("hourly_usd") == 0 and not data.get("confirm_free"):
            self.add_error(
                "hourly_usd",
                "0 makes this GPU free: tick 'free' if it is (its time is then billed at 0 and "
                "shown as free)",
            )
        return data


class GpuPriceInline(admin.TabularInline):
    model = GpuPrice
    form = GpuPriceForm
    extra = 1
    autocomplete_fields = ["sku"]


class ReadOnlyGpuPriceInline(admin.TabularInline):
    """A superseded version's prices: shown, never edited."""

    model = GpuPrice
    extra = 0
    readonly_fields = ["sku", "hourly_usd"]
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(PricingTable)
class PricingTableAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "valid_from",
        "currency",
        "gpu_prices_list",
        "vcpu_hour_usd",
        "memory_gb_hour_usd",
        "electricity_usd_per_kwh",
        "pue",
        "is_example",
    ]
    list_filter = ["tenant", "is_example", "currency"]
    search_fields = ["name", "tenant__name"]
    date_hierarchy = "valid_from"
    inlines = [GpuPriceInline]
    list_select_related = ["tenant"]

    readonly_fields = ["supersedes"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("gpu_prices__sku")

    @admin.display(description="GPU per hour")
    def gpu_prices_list(self, obj) -> str:
        """Every GPU price of the table, one line (prefetched: one query for the page)."""
        prices = sorted(obj.gpu_prices.all(), key=lambda p: p.sku.name)
        if not prices:
            return "none"
        return ", ".join(
            f"{p.sku.name} {'free' if not p.hourly_usd else f'{p.hourly_usd:g}'}" for p in prices
        )

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if (
            obj is not None
            and obj.valid_from <= timezone.now()
            and "valid_from" in form.base_fields
        ):
            form.base_fields["valid_from"].help_text = (
                "In force: a price edit is saved as a new version from now, and this table "
                "keeps its prices for the time before, so nothing already priced with it moves."
            )
        return form

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.superseded_by.exists():  # its prices stay as they priced
            return [*PRICING_TABLE_FIELDS, "supersedes"]
        return self.readonly_fields

    def get_inlines(self, request, obj):
        if obj is not None and obj.superseded_by.exists():
            return [ReadOnlyGpuPriceInline]
        return self.inlines

    def save_model(self, request, obj, form, change):
        # The table as stored, before the form's edit lands: kept as it is if this edit makes a
        # new version.
        stored = PricingTable.objects.get(pk=obj.pk) if change else None
        request._pricing_stored = (stored, {} if stored is None else gpu_rates(stored))
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        if not change and form.instance.retroactive:
            messages.warning(
                request,
                f"'{form.instance}' starts before it was posted: runs open now are priced by it "
                "only from now, and finished runs only by an explicit re-price (Run re-pricings), "
                "so no open run's past moves silently.",
            )
        stored, rates = getattr(request, "_pricing_stored", (None, {}))
        priced = set(form.changed_data) & set(PRICE_FIELDS) or any(
            f.has_changed() for f in formsets
        )
        if stored is not None and stored.valid_from <= timezone.now() and priced:
            version = pricing_table_version_split(
                table=form.instance, stored=stored, stored_rates=rates
            )
            request._pricing_version = version  # said once, by response_change

    def response_change(self, request, obj):
        """After a price edit of a table in force: one message (the new version, and why), and
        on to that version; not Django's "was changed successfully" of a table that kept its
        prices."""
        version = getattr(request, "_pricing_version", None)
        if version is None:
            return super().response_change(request, obj)
        self.message_user(
            request,
            f"Saved as a new version, '{version}' (id {version.pk}), in force from "
            f"{version.valid_from:%Y-%m-%d %H:%M:%S} UTC: prices in force are never edited, so "
            f"'{obj}' keeps its prices for the time before and nothing priced with it moves.",
            messages.SUCCESS,
        )
        if "_continue" in request.POST:
            target = reverse("admin:pricing_pricingtable_change", args=[version.pk])
        else:
            target = reverse("admin:pricing_pricingtable_changelist")
        return HttpResponseRedirect(target)


@admin.register(CostModel)
class CostModelAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "unit"]
    list_filter = ["kind", "tenant"]
    search_fields = ["name"]
    list_select_related = ["tenant"]


@admin.register(InstanceType)
class InstanceTypeAdmin(admin.ModelAdmin):
    """The instance catalogue a FOCUS import prices through (shipped, and yours to edit: point an
    instance type at your GPU SKU's name, or add one the invoice names)."""

    list_display = [
        "name",
        "provider",
        "gpu_sku_name",
        "gpu_count",
        "vcpus",
        "memory_gib",
        "catalogue_version",
    ]
    list_filter = ["provider", "catalogue_version"]
    search_fields = ["name", "gpu_sku_name"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.catalogue_version = 0  # added here, not shipped
        super().save_model(request, obj, form, change)


@admin.register(FocusImport)
class FocusImportAdmin(admin.ModelAdmin):
    """What each FOCUS import derived and left out (read-only: an import is a record)."""

    list_display = [
        "created_at",
        "tenant",
        "filename",
        "focus_version",
        "currency",
        "pricing_table",
        "created_version",
        "rows",
        "usage_stored",
    ]
    list_filter = ["tenant", "focus_version"]
    list_select_related = ["tenant", "pricing_table"]
    search_fields = ["filename", "sha256", "billing_account"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
