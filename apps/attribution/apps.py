from django.apps import AppConfig


class AttributionConfig(AppConfig):
    name = "apps.attribution"
    label = "attribution"
