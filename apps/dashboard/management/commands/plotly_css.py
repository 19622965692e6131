"""Write frontend/static/dashboard/plotly.css from the installed plotly.js (run after upgrading
plotly)."""

from django.core.management.base import BaseCommand

from apps.dashboard.plotly_css import STYLESHEET, plotly_css


class Command(BaseCommand):
    help = (
        "Write plotly.js's global style rules to a static stylesheet (the CSP allows no inline "
        "style)."
    )

    def handle(self, *args, **options):
        STYLESHEET.write_text(plotly_css(), encoding="utf-8")
        self.stdout.write(f"wrote {STYLESHEET}")
