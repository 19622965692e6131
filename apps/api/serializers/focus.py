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
