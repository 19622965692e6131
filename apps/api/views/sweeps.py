"""Sweeps: a search for cheaper strategies, probed on workers, kept on a Pareto frontier."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.api.serializers.experiments import ArmSerializer
from apps.api.serializers.sweeps import (
    ProbeSerializer,
    SweepCreatedSerializer,
    SweepCreateSerializer,
    SweepDetailSerializer,
    SweepPromoteSerializer,
    SweepSerializer,
)
from apps.api.views.base import TenantViewSet
from apps.core.exceptions import ApplicationError
from apps.sweeps import services
from apps.sweeps.models import Sweep
from apps.sweeps.selectors import queue_warnings, sweep_frontier, sweep_list


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """A sweep proposes strategies with Optuna and probes each briefly on a worker."""

    model = Sweep
    selector = staticmethod(sweep_list)
    serializer_class = SweepSerializer

    def get_serializer_class(self):
        return SweepDetailSerializer if self.action == "retrieve" else SweepSerializer

    @extend_schema(request=SweepCreateSerializer, responses={201: SweepCreatedSerializer})
    def create(self, request):
        """Start a sweep: 201 once its first probes are queued (with `warnings` when no worker
        consumes its queue now); 400 naming the field, nothing queued."""
        serializer = SweepCreateSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        sweep = services.sweep_create(tenant=request.tenant, **serializer.validated_data)
        data = {**SweepDetailSerializer(sweep).data, "warnings": queue_warnings(queue=sweep.queue)}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=SweepSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the sweep: queued probes are cancelled, a running one stops at its next step."""
        return Response(SweepSerializer(services.sweep_cancel(sweep=self.get_object())).data)

    @extend_schema(responses=ProbeSerializer(many=True))
    @action(detail=True, methods=["get"])
    def frontier(self, request, pk=None):
        """Every probe with its measurements, `on_frontier` marking the non-dominated ones."""
        return Response(ProbeSerializer(sweep_frontier(sweep=self.get_object()), many=True).data)

    @extend_schema(request=SweepPromoteSerializer, responses={201: ArmSerializer})
    @action(detail=True, methods=["post"])
    def promote(self, request, pk=None):
        """Turn a frontier point into an arm of an experiment (existing, or new with the base as
        control); 409 when its held-out loss is worse than the base's beyond the margin, or not
        measured, unless `force: true`."""
        sweep = self.get_object()
        serializer = SweepPromoteSerializer(
            data=request.data, context=self.get_serializer_context()
        )
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        probe = sweep.probes.filter(pk=data.pop("probe")).first()
        if probe is None:
            raise ApplicationError(
                "probe: not a probe of this sweep",
                {"fields": {"probe": ["not found"]}},
                code="invalid",
            )
        arm = services.sweep_promote(sweep=sweep, probe=probe, actor=request.user, **data)
        return Response(
            ArmSerializer(arm, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED,
        )
