"""The runs page (filter, sort, paginate, CSV), the compare view of 2-4 runs, the experiment
comparison as CSV, the spend page, the reconciliation page (and its CSV), and the download of a
file a run saved."""

from __future__ import annotations

import csv
from datetime import date

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import (
    FileResponse,
    Http404,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET

from apps.billing.interface import month_bounds, reconciliation, reconciliation_csv
from apps.core.exceptions import ApplicationError
from apps.dashboard import runs as runs_selectors
from apps.dashboard import selectors
from apps.dashboard.forms import RunFilterForm
from apps.dashboard.reconciliation import reconciliation_page
from apps.experiments.models import Arm
from apps.experiments.runs import run_artifact_file

PAGE_SIZE = 50


class _Echo:
    """csv.writer's file: hands each line back to the streaming response."""

    def write(self, value: str) -> str:
        return value


def _csv_response(rows, filename: str) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in rows), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _filter_form(request) -> RunFilterForm:
    experiments = selectors.experiments_visible(user=request.user).order_by("name")
    arms = (
        Arm.objects.filter(experiment__in=experiments)
        .select_related("experiment")
        .order_by("experiment__name", "name")
    )
    return RunFilterForm(request.GET or None, experiments=experiments, arms=arms)


def _filtered(request, form: RunFilterForm):
    filters = (
        {k: v for k, v in form.cleaned_data.items() if v not in (None, "")} if form.is_bound else {}
    )
    return runs_selectors.runs_filtered(user=request.user, **filters)


@login_required
@require_GET
def run_list(request):
    form = _filter_form(request)
    if form.is_bound and not form.is_valid():
        runs, page = None, None
    else:
        page = Paginator(_filtered(request, form), PAGE_SIZE).get_page(request.GET.get("page"))
        runs = [(run, runs_selectors.usd_per_mtok(run)) for run in page.object_list]
    query = request.GET.copy()
    query.pop("page", None)
    sort_query = query.copy()
    sort_query.pop("sort", None)
    current = form.cleaned_data.get("sort") if form.is_bound and form.is_valid() else ""
    return render(
        request,
        "dashboard/run_list.html",
        {
            "form": form,
            "page": page,
            "runs": runs,
            "query": query.urlencode(),
            "sort_query": sort_query.urlencode(),
            "sort": current or runs_selectors.DEFAULT_SORT,
            "compare_max": runs_selectors.COMPARE_MAX,
        },
        status=400 if runs is None else 200,
    )


@login_required
@require_GET
def run_list_csv(request):
    form = _filter_form(request)
    if form.is_bound and not form.is_valid():
        return HttpResponseBadRequest(
            "; ".join(e for errors in form.errors.values() for e in errors),
            content_type="text/plain; charset=utf-8",
        )
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    return _csv_response(
        runs_selectors.runs_csv_rows(_filtered(request, form)), f"costlab-runs-{stamp}.csv"
    )


@login_required
@require_GET
def experiment_comparison_csv(request, pk: int):
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    rows = runs_selectors.comparison_csv_rows(experiment=experiment)
    return _csv_response(
        rows, f"costlab-{slugify(experiment.name) or experiment.pk}-comparison.csv"
    )


@login_required
@require_GET
def run_compare(request):
    try:
        ids = list(dict.fromkeys(int(v) for v in request.GET.getlist("run") if v.strip()))
    except ValueError:
        ids = []
    low, high = runs_selectors.COMPARE_MIN, runs_selectors.COMPARE_MAX
    found = (
        runs_selectors.runs_compare(user=request.user, ids=ids) if low <= len(ids) <= high else None
    )
    if found is None or len(found["runs"]) != len(ids):
        message = (
            f"run: choose {low} to {high} runs to compare (got {len(ids)})"
            if found is None
            else "run: some of these runs do not exist or are not your team's"
        )
        return render(request, "dashboard/run_compare.html", {"error": message}, status=400)
    return render(request, "dashboard/run_compare.html", found)


@login_required
@require_GET
def spend(request):
    month = None
    if request.GET.get("month"):
        try:
            month = date.fromisoformat(request.GET["month"] + "-01")
        except ValueError:
            return render(
                request,
                "dashboard/spend.html",
                {"error": "month: YYYY-MM, e.g. 2026-12"},
                status=400,
            )
    return render(
        request,
        "dashboard/spend.html",
        runs_selectors.spend_overview(user=request.user, month=month),
    )


@login_required
@require_GET
def reconciliation_view(request):
    try:
        context = reconciliation_page(user=request.user, period=request.GET.get("period") or None)
    except ValueError as exc:
        return render(
            request,
            "dashboard/reconciliation.html",
            {"error": f"period: {exc}, e.g. 2026-05"},
            status=400,
        )
    return render(request, "dashboard/reconciliation.html", context)


@login_required
@require_GET
def reconciliation_csv_view(request):
    """Every resource-day of one team's month (`tenant`: its slug; `period`: YYYY-MM)."""
    tenant = selectors.tenants_of(user=request.user).filter(slug=request.GET.get("tenant")).first()
    if tenant is None:
        raise Http404("tenant: not one of your teams")
    period = request.GET.get("period", "")
    try:
        month_bounds(period)
        found = reconciliation(tenant=tenant, period=period)
    except ValueError as exc:
        return HttpResponseBadRequest(f"period: {exc}", content_type="text/plain; charset=utf-8")
    except ApplicationError as exc:
        return HttpResponse(
            exc.message, status=exc.status_code, content_type="text/plain; charset=utf-8"
        )
    response = StreamingHttpResponse(
        reconciliation_csv(found), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = (
        f'attachment; filename="costlab-reconciliation-{tenant.slug}-{period}.csv"'
    )
    return response


@login_required
@require_GET
def run_artifact(request, pk: int, name: str):
    """A file the run saved (finetune.save), by its name in run.artifacts; 404 for any other."""
    run = get_object_or_404(selectors.runs_visible(user=request.user), pk=pk)
    found = run_artifact_file(run, name)
    if found is None:
        raise Http404("no such artifact")
    _artifact, path = found
    return FileResponse(
        path.open("rb"),
        as_attachment=True,
        filename=path.name,
        content_type="application/octet-stream",
    )
