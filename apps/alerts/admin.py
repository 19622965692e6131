from django.contrib import admin

from apps.alerts.models import AlertChannel, AlertDelivery, BudgetEvent
from apps.core.admin import ReadOnlyAdmin


@admin.register(BudgetEvent)
class BudgetEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "tenant", "month", "state", "spend_usd", "budget_usd", "reason"]
    list_filter = ["state", "tenant"]
    list_select_related = ["tenant"]


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin):
    list_display = [
        "created_at",
        "alerted",
        "kind",
        "target",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
    ]
    list_filter = ["status", "kind"]
    list_select_related = ["event__arm", "budget_event__tenant"]

    @admin.display(description="event")
    def alerted(self, obj):
        """The freeze/unfreeze or the budget step this delivery alerts."""
        return obj.event if obj.event_id else obj.budget_event


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "experiment", "webhook_url", "email_recipients", "enabled"]
    list_filter = ["enabled", "tenant"]
    list_select_related = ["tenant", "experiment"]
