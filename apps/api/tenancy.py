"""The tenant a request acts on. Every API queryset is filtered by it."""

from __future__ import annotations

from rest_framework import exceptions

from apps.api.models import ApiToken
from apps.tenants.models import Membership, Tenant

TENANT_HEADER = "HTTP_X_COSTLAB_TENANT"
SESSION_KEY = "costlab_tenant_id"  # the dashboard may remember the user's choice here


class NoTenant(exceptions.PermissionDenied):
    default_code = "no_tenant"


def request_tenant(request) -> Tenant:
    """A token's tenant; for a session user, the tenant of their membership.

    A member of several tenants names one with the X-Costlab-Tenant header (slug), or the
    dashboard stores it in the session. Staff may act on any tenant they name.
    """
    if isinstance(request.auth, ApiToken):
        return request.auth.tenant
    user = request.user
    wanted = request.META.get(TENANT_HEADER, "").strip()
    session_tenant = getattr(request, "session", {}).get(SESSION_KEY) if not wanted else None
    memberships = Membership.objects.filter(user=user).select_related("tenant")
    if wanted:
        memberships = memberships.filter(tenant__slug=wanted)
    elif session_tenant:
        memberships = memberships.filter(tenant_id=session_tenant)
    found = [m.tenant for m in memberships[:2]]
    if len(found) == 1:
        return found[0]
    if user.is_staff and (wanted or session_tenant):
        tenant = Tenant.objects.filter(
            **({"slug": wanted} if wanted else {"pk": session_tenant})
        ).first()
        if tenant:
            return tenant
    if found:
        raise NoTenant(
            "tenant: you belong to several tenants; name one with the "
            "X-Costlab-Tenant header (its slug)"
        )
    if wanted:
        raise NoTenant(f"tenant: you are not a member of tenant '{wanted}'")
    raise NoTenant("tenant: your account is not a member of any tenant")


def tenant_role(request) -> str | None:
    """'admin' or 'member' for a session user in the request's tenant; None for a token."""
    if isinstance(request.auth, ApiToken):
        return None
    membership = (
        Membership.objects.filter(user=request.user, tenant=request.tenant).only("role").first()
    )
    return membership.role if membership else None
