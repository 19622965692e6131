from django.contrib import admin

from apps.sweeps.models import Probe, Sweep


class ProbeInline(admin.TabularInline):
    model = Probe
    extra = 0
    can_delete = False
    fields = ["number", "params", "status", "step_time_s", "peak_mem_mb", "usd_per_mtok", "reason"]
    readonly_fields = fields


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "status",
        "sampler",
        "probe_count",
        "probe_steps",
        "queue",
        "created_at",
    ]
    list_filter = ["status", "sampler", "tenant"]
    search_fields = ["name", "tenant__name"]
    list_select_related = ["tenant"]
    readonly_fields = ["status", "finished_at", "note"]
    inlines = [ProbeInline]


@admin.register(Probe)
class ProbeAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "sweep",
        "status",
        "step_time_s",
        "peak_mem_mb",
        "usd_per_mtok",
        "device",
    ]
    list_filter = ["status"]
    list_select_related = ["sweep"]
    readonly_fields = [f.name for f in Probe._meta.fields]
