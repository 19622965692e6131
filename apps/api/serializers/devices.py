from rest_framework import serializers

from apps.devices.models import Device, DeviceMeasurement
from apps.devices.selectors import device_class_label


class DeviceMeasurementSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeviceMeasurement
        fields = ["id", "measured_at", "device_class", "torch_version", "best_dtype", "profile"]
        read_only_fields = fields


class DeviceSerializer(serializers.ModelSerializer):
    latest = DeviceMeasurementSerializer(read_only=True)
    device_class_label = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = [
            "id",
            "host",
            "label",
            "device_class",
            "device_class_label",
            "queues",
            "latest",
            "error",
            "error_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_device_class_label(self, device: Device) -> str:
        return device_class_label(device.device_class)
