"""costlab's allocation as FOCUS 1.2 (GET /api/v1/focus/?period=YYYY-MM): a CSV, streamed."""

from __future__ import annotations

import json

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, OpenApiTypes, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.views import APIView

from apps.api.permissions import TenantMember
from apps.api.serializers.focus import FocusPeriodSerializer
from apps.billing.interface import focus_csv


class CsvRenderer(BaseRenderer):
    """Lets a client ask for text/csv; an error still answers its JSON body."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes | str) else json.dumps(data).encode()


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
        response = StreamingHttpResponse(
            focus_csv(tenant=request.tenant, period=period),
            content_type="text/csv; charset=utf-8",
        )
        name = f"costlab-focus-{request.tenant.slug}-{period}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
