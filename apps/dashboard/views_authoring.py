"""Authoring in the browser: create and edit an experiment with its arms, submit runs, cancel a run.

Views parse forms and call apps.dashboard.authoring (which calls the API's services); a refusal is
shown on the field it names."""

from __future__ import annotations

from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from apps.core.exceptions import ApplicationError
from apps.dashboard import selectors
from apps.dashboard.actions import act
from apps.dashboard.authoring import (
    ArmRefused,
    arm_device_warnings,
    experiment_author,
    runs_submit,
)
from apps.dashboard.forms import (
    ArmFormSet,
    ExperimentForm,
    SubmitRunsForm,
    SweepForm,
    error_to_form,
)
from apps.experiments.models import Arm
from apps.experiments.services import run_annotate, run_cancel, runs_cancel
from apps.sweeps.services import sweep_create


def strategy_examples() -> dict[str, str]:
    """The runtime's example strategies (gpu_runtime/examples/*.yaml), by file name: starting
    points."""
    import gpu_runtime

    folder = Path(gpu_runtime.__file__).parent / "examples"
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.yaml"))}


def _arm_initial(arm: Arm) -> dict:
    return {
        "arm_id": arm.pk,
        "name": arm.name,
        "strategy_yaml": arm.strategy_yaml,
        "weight": arm.weight,
        "is_control": arm.is_control,
    }


def _author(request, *, experiment=None):
    tenants = selectors.tenants_of(user=request.user)
    if experiment is None and not tenants.exists():
        messages.error(
            request, "tenant: your account is not a member of any team; ask an admin to add you"
        )
        return redirect("dashboard:experiments")
    examples = strategy_examples()
    if experiment is None:
        initial = [
            {"name": "control", "is_control": True, "strategy_yaml": examples.get("tiny", "")},
            {"name": "candidate", "strategy_yaml": examples.get("bf16-fused", "")},
        ]
    else:
        initial = [_arm_initial(arm) for arm in experiment.arms.order_by("-is_control", "name")]
    data = request.POST if request.method == "POST" else None
    form = ExperimentForm(data, instance=experiment, tenants=tenants)
    arms = ArmFormSet(data, initial=initial, prefix="arms")
    if data is not None and form.is_valid() and arms.is_valid():
        try:
            saved = experiment_author(
                tenant=form.cleaned_data.get("tenant"),
                experiment=experiment,
                fields=form.service_fields(),
                arms=arms.arms(),
                actor=request.user,
            )
        except ArmRefused as exc:
            error_to_form(arms.forms[exc.index], exc)
        except ApplicationError as exc:
            error_to_form(form, exc)
        else:
            messages.success(
                request, f"Experiment '{saved.name}' {'saved' if experiment else 'created'}."
            )
            for notice in arm_device_warnings(experiment=saved, arms=arms.arms()):
                messages.warning(request, notice)
            return redirect("dashboard:experiment", saved.pk)
    tenant = experiment.tenant if experiment else None
    return render(
        request,
        "dashboard/experiment_form.html",
        {
            "form": form,
            "arms": arms,
            "experiment": experiment,
            "examples": examples,
            "tenant_slug": tenant.slug if tenant else "",
            "validate_url": reverse("api:arm-validate-strategy"),
        },
        status=400 if data is not None else 200,
    )


@login_required
@require_http_methods(["GET", "POST"])
def experiment_new(request):
    return _author(request)


@login_required
@require_http_methods(["GET", "POST"])
def experiment_edit(request, pk: int):
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    return _author(request, experiment=experiment)


@login_required
@require_http_methods(["GET", "POST"])
def runs_new(request, pk: int):
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    form = SubmitRunsForm(request.POST or None, experiment=experiment)
    if request.method == "POST" and form.is_valid():
        try:
            runs = runs_submit(experiment=experiment, **form.cleaned_data)
        except ApplicationError as exc:
            error_to_form(form, exc)
        else:
            messages.success(
                request,
                f"{len(runs)} run{'s' if len(runs) != 1 else ''} queued: "
                + ", ".join(f"run {r.pk} ({r.arm.name})" for r in runs)
                + ".",
            )
            return redirect(f"{reverse('dashboard:runs')}?experiment={experiment.pk}")
    return render(
        request,
        "dashboard/runs_new.html",
        {"form": form, "experiment": experiment},
        status=400 if request.method == "POST" else 200,
    )


@login_required
@require_POST
def run_cancel_view(request, pk: int):
    run = get_object_or_404(selectors.runs_visible(user=request.user), pk=pk)
    act(
        request,
        lambda: run_cancel(run=run),
        done=f"Run {run.pk}: "
        f"cancelled{'' if run.status == 'queued' else '; it stops at its next step'}.",
    )
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("dashboard:run", args=[run.pk])
    return redirect(target)


@login_required
@require_POST
def run_annotate_view(request, pk: int):
    """Save a run's tags and note from its page."""
    run = get_object_or_404(selectors.runs_visible(user=request.user), pk=pk)
    tags, note = request.POST.get("tags", ""), request.POST.get("note", "")
    act(
        request,
        lambda: run_annotate(run=run, tags=tags, note=note),
        done=f"Run {run.pk}: tags and note saved.",
    )
    return redirect("dashboard:run", pk=run.pk)


@login_required
@require_POST
def experiment_runs_cancel_view(request, pk: int):
    """Cancel the queued and running runs of an experiment, or of one of its arms (asked first in
    the browser: the form's data-confirm)."""
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    arm = None
    if request.POST.get("arm"):
        arm = (
            experiment.arms.filter(pk=request.POST["arm"]).first()
            if request.POST["arm"].isdigit()
            else None
        )
        if arm is None:
            messages.error(request, f"arm: experiment '{experiment.name}' has no such arm")
            return redirect("dashboard:experiment", pk=experiment.pk)
    done = runs_cancel(experiment=experiment, arm=arm)
    which = f"arm '{arm.name}'" if arm else f"experiment '{experiment.name}'"
    messages.success(
        request,
        f"{which}: {len(done.ended)} run(s) cancelled"
        + (f", {len(done.stopping)} stop at their next step" if done.stopping else "")
        + ".",
    )
    return redirect("dashboard:experiment", pk=experiment.pk)


@login_required
@require_http_methods(["GET", "POST"])
def sweep_new(request):
    tenants = selectors.tenants_of(user=request.user)
    examples = strategy_examples()
    form = SweepForm(
        request.POST or None,
        tenants=tenants,
        initial={"base_strategy_yaml": examples.get("tiny", "")},
    )
    if request.method == "POST" and form.is_valid():
        try:
            sweep = sweep_create(**form.cleaned_data)
        except ApplicationError as exc:
            error_to_form(form, exc)
        else:
            messages.success(request, f"Sweep '{sweep.name}' started: {sweep.probe_count} probes.")
            return redirect("dashboard:sweep", sweep.pk)
    tenant = form["tenant"].value()
    return render(
        request,
        "dashboard/sweep_form.html",
        {
            "form": form,
            "examples": examples,
            "validate_url": reverse("api:arm-validate-strategy"),
            "tenant_slug": tenant or (tenants[0].slug if tenants else ""),
        },
        status=400 if request.method == "POST" else 200,
    )
