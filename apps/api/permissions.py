"""Who may do what: members read and write their tenant's experiments; staff edit prices and freeze
arms."""

from __future__ import annotations

from rest_framework import permissions

from apps.api.models import ApiToken
from apps.api.tenancy import request_tenant, tenant_role
from apps.tenants.models import Membership


class TenantMember(permissions.BasePermission):
    """Authenticated, and acting on exactly one tenant (set as request.tenant)."""

    message = "authentication: credentials were not provided or are not valid"

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        request.tenant = request_tenant(request)
        return True


def is_staff_session(request) -> bool:
    """Staff rights come with a staff user's session, never with an API token."""
    return bool(request.user and request.user.is_staff and not isinstance(request.auth, ApiToken))


class StaffWritesMembersRead(TenantMember):
    message = "permission: only staff may change this (members and API tokens may read it)"

    def has_permission(self, request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        return request.method in permissions.SAFE_METHODS or is_staff_session(request)


class StaffOnly(TenantMember):
    message = "permission: only staff (signed in to the dashboard) may do this"

    def has_permission(self, request, view) -> bool:
        return super().has_permission(request, view) and is_staff_session(request)


class TenantAdminSession(TenantMember):
    """Token management: a tenant admin (or staff) in a dashboard session; tokens cannot mint
    tokens."""

    message = "permission: managing API tokens needs a tenant admin signed in to the dashboard"

    def has_permission(self, request, view) -> bool:
        if isinstance(request.auth, ApiToken) or not super().has_permission(request, view):
            return False
        return is_staff_session(request) or tenant_role(request) == Membership.Role.ADMIN
