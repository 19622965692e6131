"""Prices from the invoice: a FOCUS cost-and-usage export (CSV or Parquet) becomes a new version of
a tenant's prices, as POST /api/v1/pricing-tables/import-focus/ does."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.core.exceptions import ApplicationError
from apps.experiments.selectors import gpu_skus_in_use
from apps.pricing.focus import VERSIONS, pricing_table_import_focus
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Import a FOCUS 1.0-1.3 export's hourly instance prices as a new pricing table version "
        "(the same file twice makes one version). Prints what it derived and skipped."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="The FOCUS export: CSV or Parquet.")
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument("--billing-account", default=None, help="BillingAccountId to read.")
        parser.add_argument("--currency", default=None, help="BillingCurrency to read (ISO 4217).")
        parser.add_argument("--focus-version", choices=VERSIONS, default=None)
        parser.add_argument(
            "--confirm-unpriced",
            action="store_true",
            help="A tenant's first table may leave SKUs of running or recent runs unpriced.",
        )
        parser.add_argument("--json", action="store_true", help="Print the whole result as JSON.")

    def handle(self, *args, file, tenant, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"--tenant: no tenant with slug '{tenant}'")
        path = Path(file)
        if not path.is_file():
            raise CommandError(f"file: {file} is not a file")
        try:
            with path.open("rb") as stream:
                outcome = pricing_table_import_focus(
                    tenant=found,
                    stream=stream,
                    filename=path.name,
                    billing_account=options["billing_account"],
                    currency=options["currency"],
                    focus_version=options["focus_version"],
                    skus_in_use=gpu_skus_in_use(tenant=found),
                    confirm_unpriced=options["confirm_unpriced"],
                )
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        shown = outcome.shown()
        if options["json"]:
            self.stdout.write(json.dumps(shown, indent=2))
            return
        table = outcome.table
        if outcome.already_imported:
            said = "already imported"
        elif outcome.created:
            said = "new version"
        else:
            said = "prices equal the version in force; no new version"
        self.stdout.write(
            f"{said}: pricing table {table.pk if table else '-'} "
            f"'{table.name if table else ''}' (FOCUS {shown['focus_version']}, "
            f"{shown['rows']} rows, {shown['currency']}, account {shown['billing_account']})"
        )
        for t in shown["derived"]["instance_types"]:
            per = t["effective_per_gpu_hour"] or t["effective_per_vcpu_hour"]
            unit = "GPU-hour" if t["effective_per_gpu_hour"] else "vCPU-hour"
            # an import stored before a field existed lacks it: .get
            listed = f"list {t['list_hourly']}/h" if t.get("list_hourly") else "no list price"
            how = f"; {t['derived']}" if t.get("derived") else ""
            self.stdout.write(
                f"  derived {t['instance_type']}: {t['hours']} h, effective {t['effective_hourly']}"
                f"/h ({listed}), {per} per {unit}{how}"
            )
            for said in t.get("component_disagreements") or ():
                self.stdout.write(f"    components disagree: {said}")
        for g in shown["skipped"]:
            numbers = ", ".join(map(str, g["row_numbers"]))
            more = "" if g["row_numbers_complete"] else " ..."
            self.stdout.write(
                f"  skipped {g['rows']} rows: {g['reason']} ({g['detail']}): rows {numbers}{more}"
            )
