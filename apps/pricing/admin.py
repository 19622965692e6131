from django.contrib import admin

from apps.pricing.models import CostModel, GpuPrice, GpuSku, PricingTable


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
        "name", "tenant", "valid_from", "currency", "electricity_usd_per_kwh", "pue", "is_example",
    ]
    list_filter = ["tenant", "is_example", "currency"]
    search_fields = ["name", "tenant__name"]
    date_hierarchy = "valid_from"
    inlines = [GpuPriceInline]
    list_select_related = ["tenant"]


@admin.register(CostModel)
class CostModelAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "kind", "unit"]
    list_filter = ["kind", "tenant"]
    search_fields = ["name"]
    list_select_related = ["tenant"]
