"""costlab's allocation of a month as FOCUS 1.2 (CSV), as GET /api/v1/focus/?period= answers."""

import sys

from django.core.management.base import BaseCommand, CommandError

from apps.billing.interface import focus_csv, month_bounds
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Write a tenant's runs of a month as FOCUS 1.2 rows (one per run and UTC day), CSV."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument("--period", required=True, help="The month, YYYY-MM (UTC).")
        parser.add_argument("--output", default="-", help="A file to write (default stdout).")

    def handle(self, *args, tenant, period, output, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"--tenant: no tenant with slug '{tenant}'")
        try:
            month_bounds(period)
        except ValueError as exc:
            raise CommandError(f"--period: {exc}") from None
        out = sys.stdout if output == "-" else open(output, "w", encoding="utf-8", newline="")
        try:
            for chunk in focus_csv(tenant=found, period=period):
                out.write(chunk)
        finally:
            if out is not sys.stdout:
                out.close()
