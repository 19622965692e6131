from django import forms
from django.contrib import admin

from apps.billing.services import run_reprice
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.telemetry.models import RunRepricing


class RunRepricingForm(forms.ModelForm):
    class Meta:
        model = RunRepricing
        fields = ["run", "pricing_table", "reason"]

    def clean(self):
        cleaned = super().clean()
        run, table = cleaned.get("run"), cleaned.get("pricing_table")
        if run is not None and run.status in Run.ACTIVE_STATUSES:
            self.add_error("run", f"run {run.pk} is {run.status}; only a finished run is re-priced")
        if run is not None and table is not None and table.tenant_id != run.tenant_id:
            self.add_error("pricing_table", "not a table of the run's tenant")
        return cleaned


@admin.register(RunRepricing)
class RunRepricingAdmin(admin.ModelAdmin):
    """Re-pricing a finished run is one deliberate, audited act: add one here
    (or POST /api/v1/runs/{id}/reprice/)."""

    form = RunRepricingForm
    list_display = [
        "run",
        "at",
        "actor",
        "pricing_table",
        "cost_before_usd",
        "cost_after_usd",
        "reason",
    ]
    list_select_related = ["run", "actor", "pricing_table"]
    raw_id_fields = ["run"]
    search_fields = ["run__id", "reason"]

    def has_change_permission(self, request, obj=None):
        return False  # an audit record: never edited

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        try:
            done = run_reprice(
                run_id=obj.run_id,
                actor=request.user,
                reason=obj.reason,
                pricing_table=obj.pricing_table,
            )
        except ApplicationError as exc:  # checked by the form; a race lands here
            raise forms.ValidationError(str(exc)) from None
        for name in ("pk", "id", "at", "actor", "cost_before_usd", "cost_after_usd"):
            setattr(obj, name, getattr(done, name))
