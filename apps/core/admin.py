from django.contrib import admin

from apps.core.models import PeriodicTaskRun


@admin.register(PeriodicTaskRun)
class PeriodicTaskRunAdmin(admin.ModelAdmin):
    """Read-only: written by the beat tasks themselves."""

    list_display = ("name", "last_started_at", "last_duration_s", "runs")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Audit records: visible to staff, never edited (attribution's and alerts' admins)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
