"""Prices: read by members and API tokens, written by staff."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response

from apps.api.filters import CostModelFilter, PricingTableFilter
from apps.api.permissions import StaffWritesMembersRead, TenantMember
from apps.api.serializers.focus import FocusImportResult, FocusImportSerializer
from apps.api.serializers.pricing import (
    CostModelSerializer,
    GpuSkuSerializer,
    PricingTableSerializer,
)
from apps.api.views.base import TenantViewSet
from apps.experiments.selectors import gpu_skus_in_use
from apps.pricing import services
from apps.pricing.focus import pricing_table_import_focus
from apps.pricing.models import CostModel, GpuSku, PricingTable
from apps.pricing.selectors import cost_model_list, pricing_table_list


class GpuSkuViewSet(viewsets.ReadOnlyModelViewSet):
    """Accelerator models that can be priced (shared by every tenant)."""

    permission_classes = [TenantMember]
    queryset = GpuSku.objects.order_by("name")
    serializer_class = GpuSkuSerializer


class PricingTableViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Prices in force from `valid_from` until the next table of the tenant starts."""

    model = PricingTable
    selector = staticmethod(pricing_table_list)
    permission_classes = [StaffWritesMembersRead]
    serializer_class = PricingTableSerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = PricingTableFilter
    max_body_bytes = None  # ApiGuardMiddleware's cap, by setting name; the FOCUS import raises it

    def create(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        table = services.pricing_table_create(
            tenant=request.tenant,
            skus_in_use=gpu_skus_in_use(tenant=request.tenant),
            **serializer.validated_data,
        )
        return Response(self.get_serializer(table).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        serializer = self.get_serializer(self.get_object(), data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        table = services.pricing_table_update(
            table=serializer.instance,
            skus_in_use=gpu_skus_in_use(tenant=request.tenant),
            **serializer.validated_data,
        )
        if table.pk != serializer.instance.pk:  # a price edit in force: a new version
            return Response(
                self.get_serializer(table).data,
                status=status.HTTP_201_CREATED,
                headers={"Location": f"{request.path.rsplit('/', 2)[0]}/{table.pk}/"},
            )
        return Response(self.get_serializer(table).data)

    def destroy(self, request, pk=None):
        services.pricing_table_delete(table=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request={"multipart/form-data": FocusImportSerializer},
        responses={201: FocusImportResult, 200: FocusImportResult},
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="import-focus",
        parser_classes=[MultiPartParser],
        max_body_bytes="COSTLAB_API_MAX_FOCUS_BODY_BYTES",
    )
    def import_focus(self, request):
        """Prices from the invoice: a FOCUS export becomes a new version of the tenant's prices
        (201), named for its invoice and period; the same file again answers 200 with that first
        import. What it derived and what it skipped, with the reason, is in `import`."""
        serializer = FocusImportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        upload = data["file"]
        outcome = pricing_table_import_focus(
            tenant=request.tenant,
            stream=upload.file,
            filename=upload.name or "",
            billing_account=data.get("billing_account"),
            currency=data.get("currency"),
            focus_version=data.get("focus_version"),
            skus_in_use=gpu_skus_in_use(tenant=request.tenant),
            confirm_unpriced=data["confirm_unpriced"],
        )
        table = outcome.table
        body = {
            "pricing_table": None if table is None else PricingTableSerializer(table).data,
            "import": outcome.shown(),
        }
        return Response(body, status=status.HTTP_201_CREATED if outcome.created else 200)


class CostModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """How resource use becomes money (resource_weighted or tiered_per_call)."""

    model = CostModel
    selector = staticmethod(cost_model_list)
    permission_classes = [StaffWritesMembersRead]
    serializer_class = CostModelSerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = CostModelFilter

    def create(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        cost_model = services.cost_model_create(tenant=request.tenant, **serializer.validated_data)
        return Response(self.get_serializer(cost_model).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        serializer = self.get_serializer(self.get_object(), data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        cost_model = services.cost_model_update(
            cost_model=serializer.instance, **serializer.validated_data
        )
        return Response(self.get_serializer(cost_model).data)

    def destroy(self, request, pk=None):
        services.cost_model_delete(cost_model=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
