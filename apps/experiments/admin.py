from django.contrib import admin

from apps.experiments.models import Arm, Experiment, Run, RunAttempt
from apps.experiments.services import arm_update


class ArmInline(admin.TabularInline):
    model = Arm
    extra = 0
    fields = ["name", "is_control", "weight", "state", "revision", "strategy_sha256"]
    readonly_fields = ["strategy_sha256", "state"]
    show_change_link = True


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "status", "cost_model", "freeze_threshold", "attribution_interval_s"]
    list_filter = ["status", "tenant"]
    search_fields = ["name", "tenant__name"]
    list_select_related = ["tenant", "cost_model"]
    inlines = [ArmInline]


@admin.register(Arm)
class ArmAdmin(admin.ModelAdmin):
    list_display = ["name", "experiment", "is_control", "state", "weight", "revision"]
    list_filter = ["state", "is_control"]
    search_fields = ["name", "experiment__name"]
    readonly_fields = ["strategy_sha256", "state", "revision"]
    list_select_related = ["experiment"]

    def save_model(self, request, obj, form, change):
        if change and {"strategy_yaml", "weight"} & set(form.changed_data):
            # Through the service, so a strategy edit bumps the revision and reaches running runs.
            arm_update(arm=obj, strategy_yaml=obj.strategy_yaml, weight=obj.weight)
            if set(form.changed_data) - {"strategy_yaml", "weight"}:
                super().save_model(request, obj, form, change)
        else:
            super().save_model(request, obj, form, change)


class RunAttemptInline(admin.TabularInline):
    """Every time a worker held the run, and how that ended; written by the workers, read-only here."""

    model = RunAttempt
    extra = 0
    can_delete = False
    fields = readonly_fields = ["number", "worker", "host", "started_at", "ended_at", "outcome", "reason"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    inlines = [RunAttemptInline]
    list_display = [
        "id", "experiment", "arm", "status", "kind", "attempts", "steps", "tokens", "cost_usd", "queued_at",
    ]
    list_filter = ["status", "kind", "queue"]
    search_fields = ["id", "git_sha", "experiment__name", "arm__name"]
    list_select_related = ["experiment", "arm"]
    date_hierarchy = "queued_at"
    readonly_fields = [f.name for f in Run._meta.fields if f.name not in ("cancel_requested",)]

    def has_add_permission(self, request):
        return False  # runs are submitted through the API, which checks quotas
