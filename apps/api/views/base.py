"""The base of every tenant-scoped endpoint: the tenant's queryset, or nothing."""

from __future__ import annotations

from rest_framework import viewsets

from apps.api.permissions import TenantMember


class TenantViewSet(viewsets.GenericViewSet):
    """Subclasses name a `selector(*, tenant)`; an object outside it answers 404, like a missing
    one."""

    permission_classes = [TenantMember]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    selector = None  # staticmethod(selector function)
    model = None

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no tenant
            return self.model.objects.none()
        return self.selector(tenant=self.request.tenant)
