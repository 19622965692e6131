"""Query filters of the list endpoints (django-filter); every list is already scoped to the
tenant."""

from datetime import UTC

import django_filters as filters
from django import forms
from django_filters.fields import IsoDateTimeField

from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.search import runs_search
from apps.pricing.models import CostModel, PricingTable


class UtcDateTimeField(IsoDateTimeField):
    """ISO 8601 with any offset, compared in UTC (Postgres refuses offsets past +-15:59)."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("datetime out of range") from None


class UtcDateTimeFilter(filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


class IdFilter(filters.NumberFilter):
    """An object id: a whole number in the database's range (a bigger one is a 400, not a crash)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class ExperimentFilter(filters.FilterSet):
    name = filters.CharFilter(lookup_expr="icontains", max_length=120)
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")

    class Meta:
        model = Experiment
        fields = ["status", "name", "created_after"]


class ArmFilter(filters.FilterSet):
    experiment = IdFilter(field_name="experiment_id")
    strategy_sha256 = filters.CharFilter(max_length=64)

    class Meta:
        model = Arm
        fields = ["experiment", "name", "state", "is_control", "strategy_sha256"]


class RunFilter(filters.FilterSet):
    experiment = IdFilter(field_name="experiment_id")
    arm = IdFilter(field_name="arm_id")
    git_sha = filters.CharFilter(max_length=40)
    run_key = filters.CharFilter(max_length=120)
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")
    q = filters.CharFilter(
        method="filter_q",
        max_length=200,
        help_text="Search: a run's name (run_key), a tag, its notes, a git commit prefix, or a "
        "strategy key (precision.compute_dtype, or precision.compute_dtype=bf16).",
    )

    def filter_q(self, queryset, name, value):
        return runs_search(queryset, value)

    class Meta:
        model = Run
        fields = [
            "experiment",
            "arm",
            "status",
            "kind",
            "git_sha",
            "run_key",
            "created_after",
            "created_before",
            "q",
        ]


class PricingTableFilter(filters.FilterSet):
    valid_at = UtcDateTimeFilter(
        method="filter_valid_at", help_text="Tables in force at this instant."
    )

    class Meta:
        model = PricingTable
        fields = ["is_example", "valid_at"]

    def filter_valid_at(self, queryset, name, value):
        current = queryset.filter(valid_from__lte=value).order_by("-valid_from").values("pk")[:1]
        return queryset.filter(pk__in=current)


class CostModelFilter(filters.FilterSet):
    class Meta:
        model = CostModel
        fields = ["kind"]
