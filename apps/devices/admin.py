from django.contrib import admin

from apps.devices.models import Device, DeviceMeasurement


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ("host", "label", "device_class", "queues", "latest", "error")
    search_fields = ("host", "label", "device_class")
    readonly_fields = ("host", "label", "device_class", "queues", "latest", "error", "error_at")


@admin.register(DeviceMeasurement)
class DeviceMeasurementAdmin(admin.ModelAdmin):
    list_display = ("device", "measured_at", "best_dtype", "torch_version")
    list_filter = ("best_dtype",)
    readonly_fields = (
        "device",
        "measured_at",
        "device_class",
        "torch_version",
        "best_dtype",
        "profile",
    )
