"""FOCUS: an invoice's export in (prices), costlab's allocation out."""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from apps.api.serializers.pricing import PricingTableSerializer
from apps.billing.interface import month_bounds
from apps.pricing.focus import VERSIONS


class FocusImportSerializer(serializers.Serializer):
    file = serializers.FileField(
        help_text="A FOCUS 1.0-1.3 cost-and-usage export: CSV (UTF-8, a header row) or Parquet."
    )
    billing_account = serializers.CharField(
        required=False,
        max_length=255,
        help_text="Read this BillingAccountId's rows (default: the first hourly usage row's); "
        "the others are listed as skipped.",
    )
    currency = serializers.RegexField(
        r"^[A-Z]{3}$",
        required=False,
        help_text="Read rows billed in this currency (ISO 4217; default: the first hourly usage "
        "row's); the others are listed as skipped.",
    )
    focus_version = serializers.ChoiceField(
        choices=list(VERSIONS),
        required=False,
        help_text="The file's FOCUS version (default: its FocusVersion column, else told by its "
        "columns).",
    )
    confirm_unpriced = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Save a tenant's first table that leaves a GPU SKU of running or recent runs "
        "without a price (refused with 409 naming the SKUs otherwise).",
    )


FocusImportResult = inline_serializer(
    name="FocusImportResult",
    fields={
        "pricing_table": PricingTableSerializer(
            allow_null=True, help_text="The version the import made (or the one it matched)."
        ),
        "import": serializers.DictField(
            help_text="What it read: sha256, focus_version, billing_account, currency, "
            "invoice_ids, period, rows, derived (per instance type: hours, effective and list "
            "cost and hourly price; the prices), skipped (rows left out, by reason), "
            "already_imported, created_version."
        ),
    },
)


class FocusPeriodSerializer(serializers.Serializer):
    period = serializers.RegexField(
        r"^[0-9]{4}-(0[1-9]|1[0-2])$", help_text="The month, YYYY-MM (UTC)."
    )

    def validate_period(self, value: str) -> str:
        try:
            month_bounds(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class ReconciliationQuerySerializer(FocusPeriodSerializer):
    focus_import = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="The FOCUS import to reconcile against (its id); default: the team's newest "
        "import with usage in the month.",
    )


ReconciliationResult = inline_serializer(
    name="Reconciliation",
    fields={
        "period": serializers.CharField(),
        "currency": serializers.CharField(help_text="The invoice's billing currency."),
        "focus_import": serializers.DictField(
            help_text="The import reconciled against: id, filename, sha256, billing_account, "
            "invoice_ids, period_start, period_end, created_at."
        ),
        "imports": serializers.ListField(
            child=serializers.DictField(),
            help_text="The team's imports with usage in the month, newest first (id, filename, "
            "created_at): choose one with focus_import.",
        ),
        "totals": serializers.DictField(
            help_text="invoice_usd, costlab_usd, attributed_usd, invoice_same_hours_usd, "
            "costlab_same_hours_usd, difference_usd, difference_pct, idle_usd, unmatched_usd "
            "(unmatched: no_invoice_row_usd, no_resource_recorded_usd, "
            "beyond_invoice_hours_usd), resource_days (matched, idle, unmatched), run_days."
        ),
        "biggest_differences": serializers.ListField(
            child=serializers.DictField(),
            help_text="The resource-days with the largest difference, each with every figure.",
        ),
        "idle_by_resource": serializers.ListField(
            child=serializers.DictField(),
            help_text="Idle per resource (usd, hours, days, invoice_usd), the largest first.",
        ),
        "idle_resources": serializers.IntegerField(),
        "unmatched_by_resource": serializers.ListField(
            child=serializers.DictField(),
            help_text="Unmatched per resource as the runs recorded it and status (unmatched: no "
            "invoice row; no resource recorded; matched: hours beyond the invoice's).",
        ),
        "unmatched_resources": serializers.IntegerField(),
    },
)
