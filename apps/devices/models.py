"""The hardware runs train on: each host's devices and every profile measured of them.

A profile (gpu_runtime.profile.DeviceProfile.as_dict) says what a device runs natively and how
fast: GEMM throughput per dtype, memory bandwidth, the CPU flags or the GPU's NVML figures.
Every measurement is kept; a device points at its latest. A run records the measurement it ran
on, and its device class: runs compare only within one class (apps.attribution).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from apps.core.models import TimeStampedModel


class Device(TimeStampedModel):
    host = models.CharField(max_length=255)
    label = models.CharField(max_length=120, help_text='"cpu" or e.g. "cuda:0 NVIDIA H200"')
    device_class = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_index=True,
        help_text="Comparable hardware: CPU model and flags, or GPU name",
    )
    queues = models.JSONField(default=list, help_text="The Celery queues its worker consumes")
    latest = models.ForeignKey(
        "DeviceMeasurement", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error = models.TextField(
        blank=True, default="", help_text="Why the last measurement failed (empty: it did not)"
    )
    error_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "label"]
        constraints = [
            models.UniqueConstraint(fields=["host", "label"], name="device_unique_host_label")
        ]

    def __str__(self) -> str:
        return f"{self.host} {self.label}"


class DeviceMeasurement(models.Model):
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="measurements")
    measured_at = models.DateTimeField(default=timezone.now)
    device_class = models.CharField(max_length=255)
    torch_version = models.CharField(max_length=40, blank=True, default="")
    best_dtype = models.CharField(max_length=8, help_text="What precision auto resolves to")
    profile = models.JSONField()

    class Meta:
        ordering = ["-measured_at", "-pk"]
        indexes = [models.Index(fields=["device", "-measured_at"], name="devmeas_device_time")]

    def __str__(self) -> str:
        return f"{self.device} at {self.measured_at:%Y-%m-%d %H:%M:%S}"
