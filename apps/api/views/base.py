"""The base of every tenant-scoped endpoint: the tenant's queryset, or nothing."""

from __future__ import annotations

import re

from django.http import Http404
from rest_framework import viewsets

from apps.api.permissions import TenantMember

# A positive key of at most 18 digits: every such number fits a bigint (2**63 - 1 has 19).
_PK = re.compile(r"[1-9][0-9]{0,17}")


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

    def url_pk(self) -> int:
        """The URL's pk as a number a bigint key can hold; 404 for anything else (no query)."""
        lookup = str(self.kwargs[self.lookup_url_kwarg or self.lookup_field])
        if not _PK.fullmatch(lookup):
            raise Http404
        return int(lookup)

    def get_object_pk(self) -> int:
        """The pk of the URL's object, inside the tenant (404 otherwise, like get_object), without
        loading the object: a pk no bigint holds is refused by url_pk, before any query."""
        found = self.get_queryset().filter(pk=self.url_pk()).values_list("pk", flat=True).first()
        if found is None:
            raise Http404
        return found
