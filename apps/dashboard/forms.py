"""The dashboard's forms: authoring experiments and arms, submitting runs, filtering the runs list.

Forms only parse and shape input; every rule (names, quotas, strategies) is the services', so the
browser and the API refuse the same things with the same messages (apps.experiments.services).
"""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from apps.core.exceptions import ApplicationError
from apps.dashboard.runs import SORTS
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.services import EXPERIMENT_EDITABLE
from apps.experiments.strategies import strategy_normalise
from apps.pricing.models import CostModel, PricingTable
from apps.sweeps.models import DEFAULT_OBJECTIVES, OBJECTIVES, SAMPLER_CHOICES

STRATEGY_MAX_CHARS = 64 * 1024  # as the API (gpu_runtime refuses larger documents too)
SUBMIT_MAX_RUNS = 20


class NamedErrors:
    """Every field error starts with the field's name ("weight: Ensure this value is ..."), as the
    services' do: Django's stock messages say the field only by where they are shown."""

    def full_clean(self):
        super().full_clean()
        for name, errors in list((self._errors or {}).items()):
            if name != NON_FIELD_ERRORS:
                self._errors[name] = self.error_class(
                    [e if e.startswith(f"{name}:") else f"{name}: {e}" for e in errors],
                    renderer=self.renderer,
                )


def error_to_form(form: forms.BaseForm, exc: ApplicationError) -> None:
    """A service's refusal on the form: on the field its message names ("field: reason", or
    "field.key: reason") when the form has that field, else on the form. A strategy's errors come
    one per key ("train.steps: ...")."""
    named = (
        exc.message.partition(":")[0].strip().split(".")[0]
    )  # "space.train.bogus: ..." is on space
    if named not in form.fields or form.fields[named].widget.is_hidden:
        form.add_error(None, exc.message)
        return
    per_key = (exc.extra.get("fields") or {}).get(named) if named == "strategy_yaml" else None
    for reason in per_key or [exc.message]:
        form.add_error(named, reason)


class ExperimentForm(NamedErrors, forms.ModelForm):
    """An experiment's settings; the tenant is chosen on creation only (from the user's tenants)."""

    tenant = forms.ModelChoiceField(
        queryset=None,
        to_field_name="slug",
        empty_label=None,
        help_text="The team that owns the experiment and pays for its runs.",
    )

    class Meta:
        model = Experiment
        fields = list(EXPERIMENT_EDITABLE)  # what the API may write, no more
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}
        labels = {
            "freeze_threshold": "Freeze threshold",
            "alpha": "α (false-freeze rate)",
            "attribution_interval_s": "Attribution interval (s)",
            "target_steps": "Target steps",
            "min_runs_per_arm": "Min runs per arm",
            "min_samples_per_arm": "Min samples per arm",
            "min_cs_runs_per_arm": "Min runs before the bound is consulted",
            "quality_metric": "Quality metric (held-out)",
            "quality_direction": "Better is",
            "quality_margin": "Quality margin",
        }

    field_order = ["tenant", "name"]

    def __init__(self, *args, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        tenant_ids = [t.pk for t in tenants]
        many = len(tenant_ids) > 1
        self.fields["tenant"].queryset = tenants
        if self.instance.pk:
            del self.fields["tenant"]  # an experiment never changes team
            tenant_ids = [self.instance.tenant_id]
        cost_models = (
            CostModel.objects.filter(tenant_id__in=tenant_ids)
            .select_related("tenant")
            .order_by("name")
        )
        tables = (
            PricingTable.objects.filter(tenant_id__in=tenant_ids)
            .select_related("tenant")
            .order_by("-valid_from")
        )
        self.fields["cost_model"].queryset = cost_models
        self.fields["pricing_table"].queryset = tables
        if many and not self.instance.pk:
            self.fields["cost_model"].label_from_instance = lambda m: f"{m.name} ({m.tenant.name})"
            self.fields["pricing_table"].label_from_instance = lambda t: f"{t} ({t.tenant.name})"
        self.fields["pricing_table"].empty_label = "the table in force when each sample was taken"
        # Quality keeps its defaults (eval_loss, lower is better, 1 %) where a form leaves it out.
        for name in ("quality_metric", "quality_direction", "quality_margin"):
            self.fields[name].required = False
        if not self.instance.pk:
            self.initial.setdefault(
                "cost_model", next(iter(cost_models.values_list("pk", flat=True)[:1]), None)
            )

    def _post_clean(self):
        """Skip the model's own validation here: the service validates, naming the field."""

    def service_fields(self) -> dict:
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if name != "tenant"
            and not (name.startswith("quality_") and value in (None, ""))  # the model's default
        }


class ArmForm(NamedErrors, forms.Form):
    """One arm: its name, strategy (YAML), traffic weight and whether it is the control."""

    arm_id = forms.IntegerField(widget=forms.HiddenInput, required=False)
    name = forms.CharField(max_length=80)
    strategy_yaml = forms.CharField(
        label="Strategy (YAML)",
        max_length=STRATEGY_MAX_CHARS,
        strip=False,
        widget=forms.Textarea(
            attrs={"rows": 9, "spellcheck": "false", "data-strategy-editor": "1", "class": "code"}
        ),
        help_text="Checked against the training runtime's schema as you type; errors name the key.",
    )
    weight = forms.DecimalField(
        max_digits=7,
        decimal_places=4,
        min_value=Decimal("0"),
        initial=Decimal("1"),
        help_text="Relative share of new runs (>= 0).",
    )
    is_control = forms.BooleanField(required=False, label="Control arm")

    def clean_strategy_yaml(self) -> str:
        return strategy_normalise(self.cleaned_data["strategy_yaml"])


class BaseArmFormSet(forms.BaseFormSet):
    def clean(self):
        if any(self.errors):
            return
        arms = [
            f.cleaned_data for f in self.forms if f.cleaned_data and not self._should_delete_form(f)
        ]
        if not arms:
            raise ValidationError(
                "arms: an experiment needs at least one arm (fill in a name and a strategy)"
            )
        names = [a["name"] for a in arms]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise ValidationError(
                f"name: two arms are named '{duplicate}'; arm names are unique per experiment"
            )
        if sum(1 for a in arms if a["is_control"]) > 1:
            raise ValidationError("is_control: only one arm can be the control")

    def arms(self) -> list[dict]:
        """The filled-in arms, in order, each with its form's index; `delete` for an existing arm
        ticked for deletion (a new one ticked is left out)."""
        out = []
        for i, form in enumerate(self.forms):
            if not form.cleaned_data or (
                self._should_delete_form(form) and not form.cleaned_data.get("arm_id")
            ):
                continue
            out.append({**form.cleaned_data, "index": i, "delete": self._should_delete_form(form)})
        return out


ArmFormSet = forms.formset_factory(
    ArmForm, formset=BaseArmFormSet, extra=2, max_num=12, absolute_max=12, can_delete=True
)


class SubmitRunsForm(NamedErrors, forms.Form):
    count = forms.IntegerField(
        min_value=1,
        max_value=SUBMIT_MAX_RUNS,
        initial=2,
        label="Runs",
        help_text=f"How many runs to queue (1-{SUBMIT_MAX_RUNS}); all or none are queued.",
    )
    arm = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="any arm, by traffic weight",
        help_text="Route every run to this arm, or let the weights choose per run.",
    )
    git_sha = forms.RegexField(
        regex=r"^[0-9a-fA-F]{0,40}$",
        max_length=40,
        required=False,
        label="Git commit",
        error_messages={"invalid": "hexadecimal, up to 40 characters"},
    )

    def __init__(self, *args, experiment: Experiment, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["arm"].queryset = experiment.arms.filter(state=Arm.State.ACTIVE).order_by(
            "-is_control", "name"
        )


class RunFilterForm(NamedErrors, forms.Form):
    """The runs page's filters and sort, from the query string; a bad value is named, never a
    500."""

    q = forms.CharField(
        required=False,
        max_length=200,
        label="Search",
        widget=forms.TextInput(
            attrs={"placeholder": "name, tag, note, commit, or key=value", "type": "search"}
        ),
        help_text="A run's name (run key), a tag, its notes, a git commit prefix, or a strategy "
        "key (precision.compute_dtype=bf16).",
    )
    experiment = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="all experiments"
    )
    arm = forms.ModelChoiceField(queryset=None, required=False, empty_label="all arms")
    status = forms.ChoiceField(choices=[("", "any status"), *Run.Status.choices], required=False)
    git_sha = forms.RegexField(
        regex=r"^[0-9a-fA-F]{1,40}$",
        max_length=40,
        required=False,
        label="Git commit",
        error_messages={"invalid": "hexadecimal, a prefix of the commit"},
    )
    since = forms.DateField(
        required=False, label="Queued from", widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        required=False, label="Queued until", widget=forms.DateInput(attrs={"type": "date"})
    )
    sort = forms.ChoiceField(
        required=False, choices=[(f"{d}{k}", k) for k in SORTS for d in ("-", "")]
    )

    def __init__(self, *args, experiments, arms, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["experiment"].queryset = experiments
        self.fields["arm"].queryset = arms
        self.fields["arm"].label_from_instance = lambda a: f"{a.experiment.name} / {a.name}"
        self.fields["sort"].error_messages["invalid_choice"] = (
            f"one of {', '.join(SORTS)}, with '-' first for descending"
        )

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            self.add_error("until", "must be on or after 'queued from' (since)")
        return data


class SweepForm(NamedErrors, forms.Form):
    """A strategy search: a base strategy, the space of values to try, how many probes, what to
    minimise."""

    EXAMPLE_SPACE = (
        '{\n  "train.global_batch": [4, 8],\n  "precision.compute_dtype": ["fp32", "bf16"]\n}'
    )

    tenant = forms.ModelChoiceField(
        queryset=None,
        to_field_name="slug",
        empty_label=None,
        help_text="The team that pays for the probes.",
    )
    name = forms.CharField(max_length=120)
    base_strategy_yaml = forms.CharField(
        label="Base strategy (YAML)",
        max_length=STRATEGY_MAX_CHARS,
        strip=False,
        widget=forms.Textarea(
            attrs={"rows": 8, "spellcheck": "false", "data-strategy-editor": "1", "class": "code"}
        ),
        help_text="Every probe trains this strategy with the space's values put in.",
    )
    space = forms.JSONField(
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "class": "code"}),
        initial=EXAMPLE_SPACE,
        help_text="JSON: dotted strategy key -> a list of values, "
        'or {"low", "high", "step" | "log2"}.',
    )
    objectives = forms.MultipleChoiceField(
        choices=list(OBJECTIVES.items()),
        initial=DEFAULT_OBJECTIVES,
        widget=forms.CheckboxSelectMultiple,
        help_text="Minimised together.",
    )
    sampler = forms.ChoiceField(
        choices=[(s, s) for s in SAMPLER_CHOICES],
        initial="auto",
        help_text="auto: the whole grid when it fits the probes, else TPE.",
    )
    probe_count = forms.IntegerField(min_value=1, max_value=500, initial=4, label="Probes")
    probe_steps = forms.IntegerField(
        min_value=2, max_value=100_000, initial=20, label="Steps per probe"
    )
    warmup_steps = forms.IntegerField(
        min_value=0, max_value=10_000, initial=2, label="Warm-up steps (not timed)"
    )
    parallelism = forms.IntegerField(min_value=1, max_value=1024, initial=2, label="Probes at once")
    seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0)

    def __init__(self, *args, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants

    def clean_base_strategy_yaml(self) -> str:
        return strategy_normalise(self.cleaned_data["base_strategy_yaml"])
