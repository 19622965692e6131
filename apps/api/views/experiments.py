"""Experiments and their arms."""

from __future__ import annotations

import dataclasses

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter
from rest_framework.response import Response

from apps.api.filters import ArmFilter, ExperimentFilter
from apps.api.permissions import StaffOnly
from apps.api.serializers.experiments import (
    ArmAssignmentSerializer,
    ArmAssignSerializer,
    ArmSerializer,
    ArmUpdateResultSerializer,
    ArmUpdateSerializer,
    ArmWriteResultSerializer,
    ExperimentSerializer,
    StrategyCheckResultSerializer,
    StrategyCheckSerializer,
)
from apps.api.serializers.params import ArmsParamsDiffSerializer, ArmsParamsQuerySerializer
from apps.api.serializers.report import (
    ExperimentReportSerializer,
    FreezeEventSerializer,
    FreezeRequestSerializer,
    ReportQuerySerializer,
    RunsCancelledSerializer,
    RunsCancelRequestSerializer,
    UnfreezeRequestSerializer,
)
from apps.api.views.base import TenantViewSet
from apps.attribution.reads import Minimums, arms_verdicts, experiment_report
from apps.attribution.services import arm_freeze, arm_unfreeze
from apps.core.exceptions import ApplicationError
from apps.experiments import services
from apps.experiments.assignment import arm_assign
from apps.experiments.models import Arm, Experiment
from apps.experiments.params import arm_find, arm_params, params_diff
from apps.experiments.selectors import arm_list, experiment_list


class ExperimentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """An experiment compares arms (training strategies) by what their runs cost."""

    model = Experiment
    selector = staticmethod(experiment_list)
    serializer_class = ExperimentSerializer
    filter_backends = [DjangoFilterBackend, OrderingFilter]
    filterset_class = ExperimentFilter
    ordering_fields = ["created_at", "name"]

    def create(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        experiment = services.experiment_create(tenant=request.tenant, **serializer.validated_data)
        return Response(self.get_serializer(experiment).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        serializer = self.get_serializer(self.get_object(), data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        experiment = services.experiment_update(
            experiment=serializer.instance, **serializer.validated_data
        )
        return Response(self.get_serializer(experiment).data)

    def destroy(self, request, pk=None):
        services.experiment_delete(experiment=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=ExperimentReportSerializer, parameters=[ReportQuerySerializer])
    @action(detail=True, methods=["get"])
    def report(self, request, pk=None):
        """Per arm: runs, GPU hours, energy, USD, gCO2e, USD per 1M tokens, deviation from the
        control and a verdict (`?metric=gco2e`: compared on gCO2e)."""
        query = ReportQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        experiment = self.get_object()
        report = experiment_report(experiment=experiment, metric=query.validated_data["metric"])
        threshold, minimums = float(experiment.freeze_threshold), Minimums.of(experiment)
        said = arms_verdicts(report.arms, threshold=threshold, minimums=minimums)
        arms = [
            {
                **dataclasses.asdict(arm),
                "verdict": said[arm.arm_id].verdict,
                "not_frozen": said[arm.arm_id].not_frozen,
            }
            for arm in report.arms
        ]
        return Response(
            ExperimentReportSerializer(
                {
                    **dataclasses.asdict(report),
                    "threshold": threshold,
                    "min_runs_per_arm": minimums.runs,
                    "min_samples_per_arm": minimums.samples,
                    "min_cs_runs_per_arm": minimums.cs_runs,
                    "arms": arms,
                }
            ).data
        )

    @extend_schema(request=ArmAssignSerializer, responses=ArmAssignmentSerializer)
    @action(detail=True, methods=["post"])
    def assign(self, request, pk=None):
        """The arm a run trained elsewhere uses (the SDK asks before it starts): sticky by
        run_key, new keys split by the arms' weights, never to a frozen arm. 409 unless the
        experiment is active; 429 at the tenant's concurrent-runs quota."""
        experiment = self.get_object()
        body = ArmAssignSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        assignment = arm_assign(experiment=experiment, **body.validated_data)
        return Response(ArmAssignmentSerializer(assignment).data)

    @extend_schema(parameters=[ArmsParamsQuerySerializer], responses=ArmsParamsDiffSerializer)
    @action(detail=True, methods=["get"], url_path="params-diff", url_name="params_diff")
    def params_diff(self, request, pk=None):
        """Two arms' hyperparameters compared: each arm's are the flattened keys on which all its
        newest succeeded runs that reported params agree; the answer lists the keys whose values
        differ and those only one arm has (this: arm a, other: arm b). 400 naming `a` or `b` for
        an arm the experiment does not have."""
        experiment = self.get_object()
        query = ArmsParamsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        arms = {}
        for side in ("a", "b"):
            ref = query.validated_data[side]
            arm = arm_find(Arm.objects.filter(experiment=experiment), ref)
            if arm is None:
                raise ValidationError(
                    {side: [f"no arm named (or with the id) {ref!r} in experiment {experiment.pk}"]}
                )
            arms[side] = {"id": arm.pk, "name": arm.name, **arm_params(arm)}
        diff = params_diff(arms["a"]["params"], arms["b"]["params"])
        differ = {d["key"] for d in diff}
        return Response(
            {
                "experiment": experiment.pk,
                **arms,
                "diff": diff,
                "same": len(set(arms["a"]["params"]) - differ),
            }
        )

    @extend_schema(request=RunsCancelRequestSerializer, responses=RunsCancelledSerializer)
    @action(detail=True, methods=["post"], url_path="cancel-runs", url_name="cancel_runs")
    def cancel_runs(self, request, pk=None):
        """Cancel every queued or running run of the experiment, or of one arm (`arm`)."""
        experiment = self.get_object()
        body = RunsCancelRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        arm = None
        if body.validated_data.get("arm") is not None:
            arm = experiment.arms.filter(pk=body.validated_data["arm"]).first()
            if arm is None:
                raise ApplicationError(
                    f"arm: experiment {experiment.pk} has no arm {body.validated_data['arm']}",
                    {"fields": {"arm": ["not an arm of this experiment"]}},
                    code="invalid",
                )
        done = services.runs_cancel(experiment=experiment, arm=arm)
        return Response(RunsCancelledSerializer(dataclasses.asdict(done)).data)


class ArmViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """An arm: a strategy (YAML, validated by gpu_runtime's schema) and its share of traffic."""

    model = Arm
    selector = staticmethod(arm_list)
    serializer_class = ArmSerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = ArmFilter

    @extend_schema(responses={201: ArmWriteResultSerializer})
    def create(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        arm = services.arm_create(**serializer.validated_data)
        return Response(
            {
                **self.get_serializer(arm).data,
                "warnings": services.strategy_device_warnings(arm.strategy_yaml),
            },
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=ArmUpdateSerializer, responses=ArmUpdateResultSerializer)
    def partial_update(self, request, pk=None):
        arm = self.get_object()
        serializer = ArmUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        update = services.arm_update(arm=arm, actor=request.user, **serializer.validated_data)
        data = ArmSerializer(update.arm, context=self.get_serializer_context()).data
        return Response(
            {
                **data,
                "live_keys": update.live_keys,
                "new_runs_only": update.new_runs_only,
                "warnings": services.strategy_device_warnings(update.arm.strategy_yaml),
            }
        )

    def destroy(self, request, pk=None):
        services.arm_delete(arm=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=FreezeRequestSerializer, responses=FreezeEventSerializer)
    @action(detail=True, methods=["post"], permission_classes=[StaffOnly])
    def freeze(self, request, pk=None):
        """Staff freeze an arm by hand: no new runs, weight 0, the reason kept for audit."""
        arm = self.get_object()
        serializer = FreezeRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        event = arm_freeze(
            arm_id=arm.pk,
            reason=serializer.validated_data["reason"],
            evidence={"manual": True, "by": request.user.get_username()},
            actor=request.user,
        )
        if event is None:
            raise ApplicationError(
                f"state: arm '{arm.name}' is frozen already", code="already_frozen", status=409
            )
        return Response(FreezeEventSerializer(event).data)

    @extend_schema(request=UnfreezeRequestSerializer, responses=FreezeEventSerializer)
    @action(detail=True, methods=["post"], permission_classes=[StaffOnly])
    def unfreeze(self, request, pk=None):
        """Staff give a frozen arm traffic again, saying why; its evidence starts over."""
        arm = self.get_object()
        serializer = UnfreezeRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        event = arm_unfreeze(arm=arm, actor=request.user, **serializer.validated_data)
        return Response(FreezeEventSerializer(event).data)

    @extend_schema(request=StrategyCheckSerializer, responses=StrategyCheckResultSerializer)
    @action(detail=False, methods=["post"], url_path="validate")
    def validate_strategy(self, request):
        """Check a strategy against gpu_runtime's schema and the measured devices of a queue
        (`cpu` by default) without storing anything: `warnings` name each key whose dtype is
        emulated or slower there; a dtype none of them can run is refused."""
        serializer = StrategyCheckSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        text = serializer.validated_data["strategy_yaml"]
        services.strategy_validate(text)
        warnings = services.strategy_device_warnings(text, queue=serializer.validated_data["queue"])
        return Response(
            {"valid": True, "strategy_sha256": services.strategy_sha256(text), "warnings": warnings}
        )
