from django.apps import AppConfig


class AttributionConfig(AppConfig):
    name = "apps.attribution"
    label = "attribution"

    def ready(self) -> None:
        from apps.attribution.services import weight_change_record
        from apps.experiments.services import arm_weight_changed

        arm_weight_changed.connect(weight_change_record, dispatch_uid="attribution.weight_change")
