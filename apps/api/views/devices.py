"""The devices training workers run on, with their measured profiles (shared by every tenant)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.api.permissions import StaffOnly, TenantMember
from apps.api.serializers.devices import DeviceSerializer
from apps.core.queues import CeleryQueue
from apps.devices.selectors import device_list
from apps.devices.services import devices_profile_request


class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    """Each host's devices: class, queues, the latest profile (GEMM GFLOP/s per dtype, whether
    it is native, memory bandwidth, the CPU flags or NVML's figures) and why a measurement
    failed."""

    permission_classes = [TenantMember]
    serializer_class = DeviceSerializer

    def get_queryset(self):
        return device_list()

    @extend_schema(
        request=inline_serializer(
            "DeviceMeasureRequest",
            {"queue": serializers.ChoiceField(choices=["cpu", "gpu"], default="cpu")},
        ),
        responses={
            202: inline_serializer(
                "DeviceMeasureQueued",
                {"queue": serializers.CharField(), "sent": serializers.BooleanField()},
            )
        },
    )
    @action(detail=False, methods=["post"], permission_classes=[StaffOnly])
    def measure(self, request):
        """Staff ask a training worker of a queue to measure its devices again (it records the new
        profile; every earlier measurement is kept)."""
        queue = request.data.get("queue", CeleryQueue.CPU.value)
        if queue not in (CeleryQueue.CPU.value, CeleryQueue.GPU.value):
            from apps.core.exceptions import ApplicationError

            raise ApplicationError(
                f"queue: {queue!r} is not a training queue; choose cpu or gpu", code="invalid"
            )
        sent = devices_profile_request(queue=queue)
        return Response({"queue": queue, "sent": sent}, status=status.HTTP_202_ACCEPTED)
