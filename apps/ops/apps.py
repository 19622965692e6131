from django.apps import AppConfig


class OpsConfig(AppConfig):
    """What operators scrape: /metrics over the domain apps' tables."""

    name = "apps.ops"
    label = "ops"
