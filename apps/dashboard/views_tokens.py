"""The tokens page: a tenant admin (or staff) mints API tokens for CI (the secret shown once, on
the answer to the mint), lists them with their expiry and last use, and revokes them. The same
services as /api/v1/tokens/."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.api.models import ApiToken
from apps.api.selectors import api_token_list
from apps.api.services import api_token_create, api_token_revoke, default_token_ttl
from apps.core.exceptions import ApplicationError
from apps.dashboard.selectors import token_tenants
from apps.tenants.models import Tenant

MAX_DAYS = 3650


def _days(raw: str) -> int | None:
    """expires_in_days from the form: blank is the default expiry; else 1..MAX_DAYS."""
    raw = (raw or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_DAYS:
        raise ApplicationError(f"expires_in_days: a whole number of days, 1 to {MAX_DAYS}")
    return int(raw)


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    tenants = token_tenants(user=request.user)
    minted, status = None, 200
    if request.method == "POST":
        raw = request.POST.get("tenant", "")
        tenant = get_object_or_404(
            Tenant, pk=int(raw) if raw.isdigit() else 0, pk__in=[t.pk for t in tenants]
        )
        try:
            token, secret = api_token_create(
                tenant=tenant,
                name=request.POST.get("name", ""),
                created_by=request.user,
                ttl=timedelta(days=d)
                if (d := _days(request.POST.get("expires_in_days")))
                else None,
                no_expiry=request.POST.get("no_expiry") == "on",
            )
        except ApplicationError as exc:
            messages.error(request, exc.message)
            status = 400
        else:
            minted = {"token": token, "secret": secret}
            status = 201
    ttl = default_token_ttl()
    return render(
        request,
        "dashboard/tokens.html",
        {
            "tenants": [(t, list(api_token_list(tenant=t))) for t in tenants],
            "minted": minted,
            "default_days": ttl.days if ttl else None,
            "max_days": MAX_DAYS,
        },
        status=status,
    )


@login_required
@require_POST
def token_revoke(request, pk: int):
    tenants = [t.pk for t in token_tenants(user=request.user)]
    token = get_object_or_404(ApiToken, pk=pk, tenant_id__in=tenants)
    api_token_revoke(token=token)
    messages.success(request, f"Token '{token.name}' ({token.token_key}…) is revoked.")
    return redirect("dashboard:tokens")
