"""The devices training workers run on, with their measured profiles (shared by every tenant)."""

from __future__ import annotations

from rest_framework import viewsets

from apps.api.permissions import TenantMember
from apps.api.serializers.devices import DeviceSerializer
from apps.devices.selectors import device_list


class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    """Each host's devices: class, queues, the latest profile (GEMM GFLOP/s per dtype, whether
    it is native, memory bandwidth, the CPU flags or NVML's figures) and why a measurement
    failed."""

    permission_classes = [TenantMember]
    serializer_class = DeviceSerializer

    def get_queryset(self):
        return device_list()
