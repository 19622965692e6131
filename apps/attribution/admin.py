from django.contrib import admin

from apps.attribution.models import AttributionSnapshot, FreezeEvent, WeightChange


class ReadOnlyAdmin(admin.ModelAdmin):
    """Audit records: visible to staff, never edited."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(FreezeEvent)
class FreezeEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "experiment", "arm", "action", "deviation", "deviation_low", "threshold", "actor"]
    list_filter = ["action"]
    list_select_related = ["experiment", "arm", "actor"]


@admin.register(AttributionSnapshot)
class AttributionSnapshotAdmin(ReadOnlyAdmin):
    list_display = ["computed_at", "experiment", "arm", "usd_per_mtok", "deviation", "state"]
    list_select_related = ["experiment", "arm"]


@admin.register(WeightChange)
class WeightChangeAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "arm", "old_weight", "new_weight", "reason"]
    list_select_related = ["arm"]
