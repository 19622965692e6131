"""costlab's allocation as FOCUS 1.2 (GET /api/v1/focus/?period=YYYY-MM): a CSV, streamed; and its
reconciliation with the cloud's invoice (GET /api/v1/reconciliation/?period=YYYY-MM)."""

from __future__ import annotations

import json

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, OpenApiTypes, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.permissions import TenantMember
from apps.api.serializers.focus import (
    FocusPeriodSerializer,
    ReconciliationQuerySerializer,
    ReconciliationResult,
)
from apps.billing.interface import focus_csv, reconciliation, reconciliation_csv


class CsvRenderer(BaseRenderer):
    """Lets a client ask for text/csv; an error still answers its JSON body."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes | str) else json.dumps(data).encode()


def csv_download(lines, filename: str) -> StreamingHttpResponse:
    """CSV text streamed as a download named `filename`."""
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class FocusExportView(APIView):
    """The tenant's runs of a month as FOCUS 1.2 cost-and-usage rows: one per run and UTC day,
    ChargeCategory Usage, the run's bill of that day (docs/billing.md, "Your allocation as
    FOCUS")."""

    permission_classes = [TenantMember]
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[FocusPeriodSerializer],
        responses={
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="FOCUS 1.2 rows, a header first"
            )
        },
    )
    def get(self, request):
        query = FocusPeriodSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        period = query.validated_data["period"]
        return csv_download(
            focus_csv(tenant=request.tenant, period=period),
            f"costlab-focus-{request.tenant.slug}-{period}.csv",
        )


class ReconciliationView(APIView):
    """A month of the team's bill against a FOCUS import of the cloud's invoice, per resource and
    UTC day: attributed, idle, unmatched and the difference for the same hours (docs/billing.md,
    "Reconciliation"). ?format=csv: every resource-day, streamed."""

    permission_classes = [TenantMember]
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[ReconciliationQuerySerializer],
        responses={
            (200, "application/json"): ReconciliationResult,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="Every resource-day of the month, a header first"
            ),
        },
    )
    def get(self, request):
        query = ReconciliationQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        period = query.validated_data["period"]
        found = reconciliation(
            tenant=request.tenant,
            period=period,
            focus_import=query.validated_data.get("focus_import"),
        )
        if request.accepted_renderer.format != "csv":
            return Response(found.shown())
        return csv_download(
            reconciliation_csv(found), f"costlab-reconciliation-{request.tenant.slug}-{period}.csv"
        )
