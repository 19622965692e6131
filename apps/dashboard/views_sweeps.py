"""The sweep page's actions: promote a frontier probe to an arm (of an experiment of the team, or
a new one whose control is the base), and cancel the sweep (asked first in the browser). The same
services as the API's sweeps/{id}/promote/ and sweeps/{id}/cancel/."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.core.exceptions import ApplicationError
from apps.dashboard import sweeps
from apps.dashboard.actions import act
from apps.experiments.models import Experiment
from apps.sweeps.services import sweep_cancel, sweep_promote


def _weight(raw: str) -> Decimal:
    try:
        weight = Decimal((raw or "1").strip())
    except InvalidOperation:
        raise ApplicationError(f"weight: {raw!r} is not a number") from None
    if not weight.is_finite() or weight < 0:
        raise ApplicationError("weight: must be a number >= 0")
    return weight


@login_required
@require_POST
def sweep_promote_view(request, pk: int):
    sweep = get_object_or_404(sweeps.sweeps_visible(user=request.user), pk=pk)
    try:
        raw = request.POST.get("probe", "")
        probe = sweep.probes.filter(pk=int(raw) if raw.isdigit() else 0).first()
        if probe is None:
            raise ApplicationError(f"probe: {raw or '(none)'} is not a probe of this sweep")
        chosen = request.POST.get("experiment", "")
        experiment = None
        if chosen:
            experiment = Experiment.objects.filter(
                pk=int(chosen) if chosen.isdigit() else 0, tenant_id=sweep.tenant_id
            ).first()
            if experiment is None:
                raise ApplicationError(f"experiment: {chosen} is not an experiment of the team")
        arm = sweep_promote(
            sweep=sweep,
            probe=probe,
            weight=_weight(request.POST.get("weight", "")),
            experiment=experiment,
            experiment_name=request.POST.get("experiment_name", "").strip(),
        )
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:sweep", pk=sweep.pk)
    messages.success(
        request,
        f"Probe {probe.pk} promoted: arm '{arm.name}' of experiment '{arm.experiment.name}'"
        + (" (a draft: start it on its page)" if arm.experiment.status == "draft" else "")
        + ".",
    )
    return redirect("dashboard:experiment", pk=arm.experiment_id)


@login_required
@require_POST
def sweep_cancel_view(request, pk: int):
    sweep = get_object_or_404(sweeps.sweeps_visible(user=request.user), pk=pk)
    act(request, lambda: sweep_cancel(sweep=sweep), done=f"Sweep '{sweep.name}' cancelled.")
    return redirect("dashboard:sweep", pk=sweep.pk)
