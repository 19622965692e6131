from django.apps import AppConfig


class BillingConfig(AppConfig):
    """A run's bill: telemetry stores the samples, this app prices them (apps.billing.services)
    with apps.pricing's formulas and schedule. No models of its own."""

    name = "apps.billing"
    label = "billing"

    def ready(self) -> None:
        from apps.billing.services import run_totals_close
        from apps.experiments.runs import run_ending

        run_ending.connect(run_totals_close, dispatch_uid="billing.run_totals_close")
