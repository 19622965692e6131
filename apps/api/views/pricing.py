"""Prices: read by members and API tokens, written by staff."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from apps.api.filters import CostModelFilter, PricingTableFilter
from apps.api.permissions import StaffWritesMembersRead, TenantMember
from apps.api.serializers.pricing import (
    CostModelSerializer,
    GpuSkuSerializer,
    PricingTableSerializer,
)
from apps.api.views.base import TenantViewSet
from apps.experiments.selectors import gpu_skus_in_use
from apps.pricing import services
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
