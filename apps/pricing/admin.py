from django.contrib import admin, messages
from django.utils import timezone

from apps.pricing.models import CostModel, GpuPrice, GpuSku, PricingTable
from apps.pricing.services import PRICE_FIELDS, pricing_table_version_keep


@admin.register(GpuSku)
class GpuSkuAdmin(admin.ModelAdmin):
    list_display = ["name", "vendor", "memory_gb", "tdp_w", "peak_bf16_tflops"]
    search_fields = ["name", "vendor"]


class GpuPriceInline(admin.TabularInline):
    model = GpuPrice
    extra = 1
    autocomplete_fields = ["sku"]


@admin.register(PricingTable)
class PricingTableAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "valid_from",
        "currency",
        "electricity_usd_per_kwh",
        "pue",
        "is_example",
    ]
    list_filter = ["tenant", "is_example", "currency"]
    search_fields = ["name", "tenant__name"]
    date_hierarchy = "valid_from"
    inlines = [GpuPriceInline]
    list_select_related = ["tenant"]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is not None and obj.valid_from <= timezone.now():
            form.base_fields["valid_from"].help_text = (
                "In force: a price edit takes effect from now. "
                "This table moves to now with the new prices and a "
                "copy keeps the old ones for the time before; history is never rewritten."
            )
        return form

    def save_model(self, request, obj, form, change):
        # The table as stored, before the form's edit lands: the old version,
        # if this edit starts a new one.
        request._pricing_stored = PricingTable.objects.get(pk=obj.pk) if change else None
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        stored, now = getattr(request, "_pricing_stored", None), timezone.now()
        priced = set(form.changed_data) & set(PRICE_FIELDS) or any(
            f.has_changed() for f in formsets
        )
        if stored is not None and stored.valid_from <= now and priced:
            copy = pricing_table_version_keep(table=form.instance, until=now, stored=stored)
            messages.info(
                request,
                f"Prices in force are versioned: the new prices apply from {now:%Y-%m-%d %H:%M} "
                f"UTC; '{copy.name}' keeps the old ones for the time before.",
            )
        super().save_related(request, form, formsets, change)


@admin.register(CostModel)
class CostModelAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "unit"]
    list_filter = ["kind", "tenant"]
    search_fields = ["name"]
    list_select_related = ["tenant"]
