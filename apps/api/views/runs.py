"""Runs: submit, status, cancel; external runs also send telemetry and say how they ended."""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, Http404
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, status
from rest_framework.decorators import action
from rest_framework.filters import OrderingFilter
from rest_framework.response import Response

from apps.api.filters import RunFilter
from apps.api.permissions import StaffOnly
from apps.api.serializers.params import (
    MetricQuerySerializer,
    MetricSeriesSerializer,
    ParamsQuerySerializer,
    RunParamsSerializer,
)
from apps.api.serializers.runs import (
    RunAnnotateSerializer,
    RunArtifactQuerySerializer,
    RunDetailSerializer,
    RunFinishSerializer,
    RunRepriceSerializer,
    RunRepricingSerializer,
    RunSerializer,
    RunSubmitSerializer,
)
from apps.api.serializers.sweeps import RunSizingSerializer, RunSizingStartSerializer
from apps.api.serializers.telemetry import (
    IngestResultSerializer,
    TelemetryBatchSerializer,
    TelemetryQuerySerializer,
    TelemetrySeriesSerializer,
)
from apps.api.throttles import AnonRateThrottle, IngestRateThrottle
from apps.api.views.base import TenantViewSet
from apps.billing.interface import run_external_ingest, run_reprice
from apps.experiments import services
from apps.experiments.models import Run
from apps.experiments.params import params_diff, params_flat
from apps.experiments.runs import run_artifact_file
from apps.experiments.selectors import run_list
from apps.sweeps.selectors import run_sizing_report
from apps.sweeps.services import run_sizing_start
from apps.telemetry.metrics import run_metric_series
from apps.telemetry.selectors import SERIES_UNITS, samples_downsampled


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    # PATCH sets the team's tags and note (RunAnnotateSerializer); nothing else of a run is edited.
    """One training run of an arm: its status, provenance and cost so far."""

    model = Run
    selector = staticmethod(run_list)
    serializer_class = RunSerializer
    filter_backends = [DjangoFilterBackend, OrderingFilter]
    filterset_class = RunFilter
    ordering_fields = ["created_at", "cost_usd", "finished_at"]

    max_body_bytes = (
        None  # ApiGuardMiddleware's cap, by setting name; the telemetry action raises it
    )

    def get_serializer_class(self):
        return RunDetailSerializer if self.action == "retrieve" else RunSerializer

    def get_queryset(self):
        runs = super().get_queryset()
        # A list shows no params (up to 256 KiB a run): not read for it.
        return runs.defer("params") if self.action == "list" else runs

    @extend_schema(
        parameters=[RunArtifactQuerySerializer],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The file (safetensors), as an attachment."
            )
        },
    )
    @action(detail=True, methods=["get"])
    def artifacts(self, request, pk=None):
        """Download a file the run saved (finetune.save): `name` is its file name in the run's
        artifacts; 404 for any other name."""
        run = self.get_object()
        query = RunArtifactQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        name = query.validated_data["name"]
        found = run_artifact_file(run, name)
        if found is None:
            raise exceptions.NotFound(f"artifact: run {run.pk} has no artifact named {name!r}")
        _artifact, path = found
        return FileResponse(
            path.open("rb"),
            as_attachment=True,
            filename=path.name,
            content_type="application/octet-stream",
        )

    @extend_schema(parameters=[MetricQuerySerializer], responses=MetricSeriesSerializer)
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """A training metric's series by step (`name`: one of the run's `metrics`), at most
        `points` points: a longer series is bucketed by step in SQL, each bucket's last step with
        the mean of its values, and their min and max. 404 for a name the run has no value of."""
        run_id = self.get_object_pk()
        query = MetricQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        name, points = query.validated_data["name"], query.validated_data["points"]
        series = run_metric_series(run_id=run_id, names=[name], points=points).get(name)
        if series is None:
            raise exceptions.NotFound(f"name: run {run_id} has no metric named {name!r}")
        return Response({"run": run_id, **series.as_json()})

    @extend_schema(parameters=[ParamsQuerySerializer], responses=RunParamsSerializer)
    @action(detail=True, methods=["get"])
    def params(self, request, pk=None):
        """The parameters the training reported, as sent (by kind) and flattened to dotted keys;
        with `against` (another run of the team), the keys whose values differ and those only one
        of the two has. 404 when that run is not the team's."""
        run_id = self.get_object_pk()
        query = ParamsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        against = query.validated_data.get("against")
        ids = [run_id] if against is None else [run_id, against]
        found = dict(self.get_queryset().filter(pk__in=ids).values_list("pk", "params"))
        if against is not None and against not in found:
            raise exceptions.NotFound(f"against: no run {against} among the team's runs")
        flat = params_flat(found[run_id])
        diff = None if against is None else params_diff(flat, params_flat(found[against]))
        return Response(
            {
                "run": run_id,
                "params": found[run_id],
                "flat": flat,
                "against": against,
                "diff": diff,
                "same": None if diff is None else len(set(flat) - {d["key"] for d in diff}),
            }
        )

    @extend_schema(request=RunAnnotateSerializer, responses=RunSerializer)
    def partial_update(self, request, pk=None):
        """Set the run's tags and/or note."""
        body = RunAnnotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = services.run_annotate(run=self.get_object(), **body.validated_data)
        return Response(RunSerializer(run, context=self.get_serializer_context()).data)

    @extend_schema(request=RunSubmitSerializer, responses={201: RunSerializer, 200: RunSerializer})
    def create(self, request):
        """Submit a run: 201 with its id and the arm chosen; 200 with the same run when run_key was
        seen."""
        serializer = RunSubmitSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        seen = (
            bool(data["run_key"])
            and Run.objects.filter(experiment=data["experiment"], run_key=data["run_key"]).exists()
        )
        run = services.run_submit(**data)
        return Response(
            RunSerializer(run).data, status=status.HTTP_200_OK if seen else status.HTTP_201_CREATED
        )

    @extend_schema(request=None, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: a queued or external run ends now, a running one stops at its next step."""
        return Response(RunSerializer(services.run_cancel(run=self.get_object())).data)

    @extend_schema(request=RunFinishSerializer, responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def finish(self, request, pk=None):
        """An external run ends: everything it sent is priced and its status recorded."""
        run = self.get_object()
        serializer = RunFinishSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = services.run_external_finish(run=run, **serializer.validated_data)
        return Response(RunSerializer(run).data)

    @extend_schema(request=RunRepriceSerializer, responses={201: RunRepricingSerializer})
    @action(detail=True, methods=["post"], permission_classes=[StaffOnly])
    def reprice(self, request, pk=None):
        """Re-price a finished run (staff): at one pricing table, or again at the tables in force
        when it ran. Audited."""
        run = self.get_object()
        serializer = RunRepriceSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        repricing = run_reprice(run_id=run.pk, actor=request.user, **serializer.validated_data)
        return Response(RunRepricingSerializer(repricing).data, status=status.HTTP_201_CREATED)

    def get_throttles(self):
        if self.action == "telemetry" and self.request.method == "POST":
            return [IngestRateThrottle(), AnonRateThrottle()]
        return super().get_throttles()

    @extend_schema(
        methods=["GET"],
        parameters=[TelemetryQuerySerializer],
        responses=TelemetrySeriesSerializer,
        description="Series downsampled in SQL (min/max per bucket) to at most `budget` points "
        "each.",
    )
    @extend_schema(
        methods=["POST"],
        request=TelemetryBatchSerializer,
        responses={
            200: OpenApiResponse(IngestResultSerializer, description="Stored; duplicates ignored.")
        },
        description="A batch of an external run's samples; idempotent by seq (a retried batch "
        "stores nothing twice).",
    )
    @action(
        detail=True, methods=["get", "post"], max_body_bytes="COSTLAB_API_MAX_INGEST_BODY_BYTES"
    )
    def telemetry(self, request, pk=None):
        if request.method == "POST":  # the hot path: the service reads the run once, locked,
            # inside the tenant (the read that checks the tenant is the one that locks)
            batch = TelemetryBatchSerializer(data=request.data)
            if not batch.is_valid():
                self.get_object_pk()  # another tenant's run, or none: 404 before 400
                raise exceptions.ValidationError(batch.errors)
            try:
                result = run_external_ingest(
                    run_id=self.url_pk(), tenant_id=request.tenant.pk, **batch.validated_data
                )
            except Run.DoesNotExist:
                raise Http404 from None
            return Response(IngestResultSerializer(result).data)
        run = self.get_object()
        query = TelemetryQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        budget = min(
            q.get("budget") or settings.COSTLAB_API_TELEMETRY_BUDGET,
            settings.COSTLAB_API_TELEMETRY_MAX_BUDGET,
        )
        down = samples_downsampled(
            runs=[run],
            fields=q["fields"],
            budget=budget,
            since=q.get("since"),
            until=q.get("until"),
        )
        series = {
            name: {"unit": SERIES_UNITS[name], "points": [[ts.isoformat(), v] for ts, v in points]}
            for name, points in down.series[run.pk].items()
        }
        return Response(
            {
                "run": run.pk,
                "budget": budget,
                "samples": down.samples.get(run.pk, 0),
                "estimated": down.estimated.get(run.pk, False),
                "series": series,
            }
        )

    @extend_schema(methods=["GET"], responses=RunSizingSerializer)
    @extend_schema(
        methods=["POST"], request=RunSizingStartSerializer, responses={201: RunSizingSerializer}
    )
    @action(detail=True, methods=["get", "post"])
    def sizing(self, request, pk=None):
        """vCPU right-sizing: the design document's estimate from the run's profile beside a
        measured recommendation (POST starts the probes at 1..N threads)."""
        run = self.get_object()
        if request.method == "POST":
            start = RunSizingStartSerializer(data=request.data)
            start.is_valid(raise_exception=True)
            run_sizing_start(run=run, **start.validated_data)
        report = RunSizingSerializer(run_sizing_report(run=run)).data
        return Response(
            report,
            status=status.HTTP_201_CREATED if request.method == "POST" else status.HTTP_200_OK,
        )
