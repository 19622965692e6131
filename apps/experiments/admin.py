from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm, ArmAssignment, Experiment, Run, RunAttempt
from apps.experiments.services import arm_create, arm_delete, arm_update
from apps.experiments.strategies import strategy_normalise, strategy_validate

ARM_FIELDS = (
    "name",
    "is_control",
    "weight",
    "strategy_yaml",
)  # what staff edit; the services write them


class ArmAdminForm(forms.ModelForm):
    """The strategy as a YAML file has it (LF, a final newline, so its SHA-256 matches the file),
    refused with the key named when gpu_runtime would refuse it."""

    class Meta:
        model = Arm
        fields = ["experiment", *ARM_FIELDS]

    def clean_strategy_yaml(self):
        text = strategy_normalise(self.cleaned_data["strategy_yaml"])
        try:
            strategy_validate(text)
        except ApplicationError as exc:
            raise ValidationError(exc.extra["fields"]["strategy_yaml"]) from None
        return text


def arm_save(arm: Arm, changed: list[str], actor=None) -> Arm:
    """Create or edit an arm through the services (revision, hash, live reload),
    whatever changed."""
    try:
        if arm.pk is None:
            return arm_create(
                experiment=arm.experiment,
                name=arm.name,
                strategy_yaml=arm.strategy_yaml,
                weight=arm.weight,
                is_control=arm.is_control,
            )
        values = {f: getattr(arm, f) for f in ARM_FIELDS if f in changed}
        return arm_update(arm=arm, actor=actor, **values).arm
    except ApplicationError as exc:
        raise ValidationError(exc.message) from None


class ArmInline(admin.TabularInline):
    model = Arm
    form = ArmAdminForm
    extra = 0
    fields = [
        "name",
        "is_control",
        "weight",
        "strategy_yaml",
        "state",
        "revision",
        "strategy_sha256",
    ]
    readonly_fields = ["strategy_sha256", "state", "revision"]
    show_change_link = True


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "status",
        "cost_model",
        "freeze_threshold",
        "attribution_interval_s",
    ]
    list_filter = ["status", "tenant"]
    search_fields = ["name", "tenant__name"]
    list_select_related = ["tenant", "cost_model"]
    inlines = [ArmInline]

    def save_formset(self, request, form, formset, change):
        if formset.model is not Arm:
            return super().save_formset(request, form, formset, change)
        formset.save(commit=False)
        for arm in formset.deleted_objects:
            arm_delete(arm=arm)
        for arm in formset.new_objects:
            arm.experiment = form.instance
            arm_save(arm, list(ARM_FIELDS))
        for arm, changed in formset.changed_objects:
            arm_save(arm, changed, actor=request.user)


@admin.register(Arm)
class ArmAdmin(admin.ModelAdmin):
    list_display = ["name", "experiment", "is_control", "state", "weight", "revision"]
    list_filter = ["state", "is_control"]
    search_fields = ["name", "experiment__name"]
    readonly_fields = ["strategy_sha256", "state", "revision"]
    list_select_related = ["experiment"]

    form = ArmAdminForm

    def get_readonly_fields(self, request, obj=None):
        # An arm's runs and evidence belong to its experiment: it never moves to another one.
        return [*self.readonly_fields, "experiment"] if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        # Every field through the services: one write, so a strategy edit's new revision is never
        # overwritten by a second save of the form's stale copy.
        saved = arm_save(obj, form.changed_data if change else list(ARM_FIELDS), actor=request.user)
        obj.pk, obj.revision, obj.strategy_sha256 = saved.pk, saved.revision, saved.strategy_sha256


class RunAttemptInline(admin.TabularInline):
    """Every time a worker held the run, and how that ended; written by the workers,
    read-only here."""

    model = RunAttempt
    extra = 0
    can_delete = False
    fields = readonly_fields = [
        "number",
        "worker",
        "host",
        "started_at",
        "ended_at",
        "outcome",
        "reason",
    ]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    inlines = [RunAttemptInline]
    list_display = [
        "id",
        "experiment",
        "arm",
        "status",
        "kind",
        "attempts",
        "steps",
        "tokens",
        "cost_usd",
        "queued_at",
    ]
    list_filter = ["status", "kind", "queue"]
    search_fields = ["id", "git_sha", "experiment__name", "arm__name"]
    list_select_related = ["experiment", "arm"]
    date_hierarchy = "queued_at"
    readonly_fields = [f.name for f in Run._meta.fields if f.name not in ("cancel_requested",)]

    def has_add_permission(self, request):
        return False  # runs are submitted through the API, which checks quotas


@admin.register(ArmAssignment)
class ArmAssignmentAdmin(admin.ModelAdmin):
    """Which arm each run key trains (POST experiments/{id}/assign/); read-only: an assignment
    is sticky for good."""

    list_display = ["run_key", "experiment", "arm", "created_at"]
    search_fields = ["run_key", "experiment__name", "arm__name"]
    list_select_related = ["experiment", "arm"]
    readonly_fields = ["experiment", "run_key", "arm", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
