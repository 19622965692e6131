from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Alerts: channels, the deliveries' outbox (webhook, e-mail, a log line) and budget events.
    Below billing and attribution: they hand it plain payloads (apps/alerts/README.md)."""

    name = "apps.alerts"
    label = "alerts"
