"""Reads of experiments, arms and runs, always scoped to one tenant."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from apps.experiments.models import Arm, Experiment, Run
from apps.tenants.models import Tenant


def experiment_list(*, tenant: Tenant) -> QuerySet[Experiment]:
    arms = Arm.objects.order_by("-is_control", "name")
    return (
        Experiment.objects.filter(tenant=tenant)
        .select_related("cost_model", "pricing_table")
        .prefetch_related(Prefetch("arms", queryset=arms))
        .order_by("-created_at", "-pk")
    )


def arm_list(*, tenant: Tenant) -> QuerySet[Arm]:
    return Arm.objects.filter(experiment__tenant=tenant).select_related("experiment").order_by("experiment", "pk")


def run_list(*, tenant: Tenant) -> QuerySet[Run]:
    return Run.objects.filter(tenant=tenant).select_related("arm", "gpu_sku").order_by("-created_at", "-pk")
