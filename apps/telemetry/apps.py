from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Stores and reads samples; billing them is apps.billing's."""

    name = "apps.telemetry"
    label = "telemetry"
