"""Who am I, the strategy schema (for editors and the CLI), and the API root."""

from __future__ import annotations

from django.http import JsonResponse
from django.urls import Resolver404, resolve
from drf_spectacular.utils import OpenApiTypes, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.routers import APIRootView, DefaultRouter
from rest_framework.views import APIView

from apps.api.models import ApiToken
from apps.api.permissions import TenantMember, is_staff_session
from apps.core.exceptions import error_body

WhoAmI = inline_serializer(
    name="WhoAmI",
    fields={
        "tenant": inline_serializer(
            name="TenantRef",
            fields={
                "id": serializers.IntegerField(),
                "slug": serializers.CharField(),
                "name": serializers.CharField(),
            },
        ),
        "principal": serializers.CharField(help_text="token:<name> or the username."),
        "auth": serializers.ChoiceField(choices=["token", "session"]),
        "staff": serializers.BooleanField(),
        "token_expiry": serializers.DateTimeField(allow_null=True),
    },
)


class WhoAmIView(APIView):
    permission_classes = [TenantMember]

    @extend_schema(responses=WhoAmI)
    def get(self, request):
        tenant = request.tenant
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response(
            {
                "tenant": {"id": tenant.pk, "slug": tenant.slug, "name": tenant.name},
                "principal": str(request.user.username),
                "auth": "token" if token else "session",
                "staff": is_staff_session(request),
                "token_expiry": token.expiry if token else None,
            }
        )


class StrategySchemaView(APIView):
    """JSON Schema of a strategy YAML document (gpu_runtime's own)."""

    permission_classes = [TenantMember]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request):
        from gpu_runtime import strategy_json_schema

        return Response(strategy_json_schema())


def api_not_found(request, *args, **kwargs):
    """Unknown /api/ paths answer with the API's error body, not an HTML page."""
    message = f"no API endpoint at {request.path}"
    if not request.path.endswith("/"):
        try:
            if resolve(request.path + "/").func is not api_not_found:
                message += f" (endpoints end with a slash: {request.path}/)"
        except Resolver404:
            pass
    return JsonResponse(error_body(message, "not_found"), status=404)


class ApiRootView(APIRootView):
    """GET /api/v1/: a link to every collection, the schema and Swagger UI. Open to anyone: it lists
    addresses only; each of them asks for a token or a session."""

    permission_classes = [AllowAny]
    # Besides the router's collections (name -> URL name in the api namespace).
    EXTRA = {
        "me": "me",
        "strategy-schema": "strategy-schema",
        "schema": "schema",
        "swagger": "swagger",
    }


class ApiRouter(DefaultRouter):
    APIRootView = ApiRootView

    def get_api_root_view(self, api_urls=None):
        list_name = self.routes[0].name
        links = {
            prefix: list_name.format(basename=basename) for prefix, _, basename in self.registry
        }
        return self.APIRootView.as_view(api_root_dict={**links, **ApiRootView.EXTRA})
