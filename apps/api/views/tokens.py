"""API tokens of the caller's tenant: listed, minted (secret shown once) and revoked by a tenant
admin."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.response import Response

from apps.api import services
from apps.api.models import ApiToken
from apps.api.permissions import TenantAdminSession
from apps.api.selectors import api_token_list
from apps.api.serializers.tokens import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
)
from apps.api.views.base import TenantViewSet


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    model = ApiToken
    selector = staticmethod(api_token_list)
    permission_classes = [TenantAdminSession]
    serializer_class = ApiTokenSerializer
    http_method_names = ["get", "post", "delete", "head", "options"]

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer})
    def create(self, request):
        serializer = ApiTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        days = data.get("expires_in_days")
        token, secret = services.api_token_create(
            tenant=request.tenant,
            name=data["name"],
            created_by=request.user,
            ttl=timedelta(days=days) if days else None,
            no_expiry=data["no_expiry"],
        )
        token.token = secret
        return Response(ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        """Revoke: the token stops working at once; the row stays for audit."""
        services.api_token_revoke(token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
