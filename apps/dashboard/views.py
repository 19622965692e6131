"""The dashboard's pages: each view checks access, calls one selector and renders."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView, LogoutView
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from apps.alerts.services import alert_channels_of
from apps.dashboard import selectors, sweeps
from apps.dashboard.charts import RUN_FIELDS
from apps.experiments.selectors import run_outliers

# A poll asks for samples since its cursor; a tab that slept longer than this reloads instead.
LIVE_MAX_GAP = timedelta(minutes=15)


class DashboardLoginView(LoginView):
    template_name = "dashboard/login.html"
    redirect_authenticated_user = True


class DashboardLogoutView(LogoutView):
    next_page = "dashboard:login"


def _error(status: int, message: str, code: str) -> JsonResponse:
    """The API's error shape, so a script reading these endpoints sees one format."""
    return JsonResponse({"error": {"message": message, "code": code}}, status=status)


def json_endpoint(view):
    """Polled by JavaScript: a signed-out session or a missing object answers JSON, not a login
    page."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return _error(401, "signed out: reload the page to sign in again", "not_authenticated")
        try:
            return view(request, *args, **kwargs)
        except Http404:
            return _error(404, "not found", "not_found")
        except BadCursor:
            return _error(
                400, "since: ms since the epoch, at most 15 minutes ago; reload the page", "invalid"
            )

    return require_GET(wrapped)


class BadCursor(Exception):
    """The `since` cursor is missing, malformed or too old (json_endpoint answers 400)."""


def _since(request) -> datetime:
    """The `since` cursor: ms since the epoch, UTC, at most LIVE_MAX_GAP ago."""
    try:
        since = datetime.fromtimestamp(int(request.GET["since"]) / 1000, tz=UTC)
    except (KeyError, ValueError, OverflowError, OSError):
        raise BadCursor from None
    if timezone.now() - since > LIVE_MAX_GAP:
        raise BadCursor
    return since


@login_required
@require_GET
def experiment_list(request):
    rows = selectors.experiment_rows(user=request.user)
    tenants = {row.experiment.tenant_id for row in rows}
    return render(
        request, "dashboard/experiment_list.html", {"rows": rows, "many_tenants": len(tenants) > 1}
    )


@login_required
@require_GET
def experiment_detail(request, pk: int):
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    page = selectors.experiment_page(experiment=experiment)
    channels = {
        "alert_channels": alert_channels_of(experiment=experiment),
        "can_manage_alerts": experiment.tenant_id
        in {t.pk for t in selectors.token_tenants(user=request.user)},
    }
    return render(
        request, "dashboard/experiment_detail.html", {"page": page, **page.parts, **channels}
    )


@login_required
@require_GET
def experiment_comparison(request, pk: int):
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    return render(
        request,
        "dashboard/_experiment_parts.html",
        selectors.experiment_parts(experiment=experiment),
    )


@json_endpoint
def experiment_live(request, pk: int):
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    since = _since(request)
    return JsonResponse(
        selectors.experiment_live(
            experiment=experiment, since=since, known_version=request.GET.get("av", "")
        )
    )


@login_required
@require_GET
def run_detail(request, pk: int):
    run = get_object_or_404(selectors.runs_visible(user=request.user), pk=pk)
    # ?against=<run id>: the hyperparameters table shows the keys that differ from that run's
    # (one of the user's runs; another is said, never shown).
    against, against_error = None, ""
    wanted = request.GET.get("against", "").strip()
    if wanted:
        if wanted.isascii() and wanted.isdigit() and len(wanted) <= 18:
            against = (
                selectors.runs_visible(user=request.user)
                .select_related(None)
                .only("pk", "params")
                .filter(pk=int(wanted))
                .first()
            )
        if against is None:
            against_error = f"No run {wanted} among your runs to compare with."
    return render(
        request,
        "dashboard/run_detail.html",
        {
            **selectors.run_page(run=run, against=against),
            "against_wanted": wanted,
            "against_error": against_error,
            "sizing": sweeps.run_sizing(run=run),
            "outlier": run_outliers(experiment_id=run.experiment_id).get(run.pk),
        },
    )


@json_endpoint
def run_live(request, pk: int):
    run = get_object_or_404(selectors.runs_visible(user=request.user), pk=pk)
    since = _since(request)
    runs = selectors.runs_visible(user=request.user).filter(pk=run.pk)
    return JsonResponse(selectors.live_update(runs=runs, since=since, fields=RUN_FIELDS))


@login_required
@require_GET
def pricing(request):
    return render(
        request,
        "dashboard/pricing.html",
        {"tenants": selectors.pricing_overview(user=request.user)},
    )


@login_required
@require_GET
def devices(request):
    from apps.devices.selectors import device_list, device_pages

    return render(request, "dashboard/devices.html", {"devices": device_pages(device_list())})


@login_required
@require_GET
def sweep_list(request):
    return render(
        request, "dashboard/sweep_list.html", {"sweeps": sweeps.sweeps_visible(user=request.user)}
    )


@login_required
@require_GET
def sweep_detail(request, pk: int):
    sweep = get_object_or_404(sweeps.sweeps_visible(user=request.user), pk=pk)
    return render(request, "dashboard/sweep_detail.html", sweeps.sweep_page(sweep=sweep))


@json_endpoint
def sweep_live(request, pk: int):
    sweep = get_object_or_404(sweeps.sweeps_visible(user=request.user), pk=pk)
    return JsonResponse(sweeps.sweep_data(sweep=sweep))
