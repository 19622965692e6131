"""Writes of devices: a profile measured (or a measurement that failed) recorded for a host's
device."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from apps.devices.models import Device, DeviceMeasurement


@transaction.atomic
def device_profile_record(
    *, host: str, label: str, queues: list[str], profile: dict | None, error: str = ""
) -> Device:
    """Keep one measurement of a host's device (`profile`: DeviceProfile.as_dict()), or say why
    it could not be measured (`error`; the device's last good profile stands)."""
    from gpu_runtime.profile import DeviceProfile, best_dtype

    device, _ = Device.objects.select_for_update().get_or_create(host=host[:255], label=label[:120])
    device.queues = sorted(set(device.queues) | set(queues))
    if profile is None:
        device.error, device.error_at = (error or "not measured")[:4000], timezone.now()
        device.save(update_fields=["queues", "error", "error_at", "updated_at"])
        return device
    parsed = DeviceProfile.from_dict(profile)
    measurement = DeviceMeasurement.objects.create(
        device=device,
        device_class=parsed.device_class[:255],
        torch_version=parsed.torch_version[:40],
        best_dtype=best_dtype(parsed),
        profile=profile,
    )
    device.latest, device.device_class, device.error = measurement, parsed.device_class[:255], ""
    device.save(update_fields=["queues", "latest", "device_class", "error", "updated_at"])
    return device


def devices_profile_request(*, queue: str) -> bool:
    """Ask a training worker of `queue` to measure its devices again (its profile is recorded
    when it has); False when the broker could not take the message."""
    from apps.core.queues import TaskName, task_send

    return task_send(TaskName.DEVICES_PROFILE, args=[], queue=queue)
