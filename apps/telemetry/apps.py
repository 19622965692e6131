from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "apps.telemetry"
    label = "telemetry"

    def ready(self) -> None:
        from apps.experiments.runs import run_ending
        from apps.telemetry.services import run_totals_close

        run_ending.connect(run_totals_close, dispatch_uid="telemetry.run_totals_close")
