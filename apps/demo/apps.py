from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The example world of `make run`: prices, a tenant, a two-arm experiment; and the local
    launcher."""

    name = "apps.demo"
    label = "demo"
