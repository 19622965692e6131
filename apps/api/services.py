"""Writes on API tokens: mint (the secret is returned once) and revoke."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from knox.models import get_digest_token
from knox.settings import CONSTANTS

from apps.api.models import ApiToken
from apps.core.exceptions import ApplicationError
from apps.tenants.models import Tenant


def default_token_ttl() -> timedelta | None:
    days = settings.COSTLAB_API_TOKEN_TTL_DAYS
    return timedelta(days=days) if days else None


@transaction.atomic
def api_token_create(
    *,
    tenant: Tenant,
    name: str,
    created_by=None,
    ttl: timedelta | None = None,
    no_expiry: bool = False,
) -> tuple[ApiToken, str]:
    """Mint a token for one tenant. Returns (row, secret); only the secret's digest is stored."""
    name = (name or "").strip()
    if not name:
        raise ApplicationError(
            "name: a token needs a name saying which client holds it",
            {"fields": {"name": ["This field may not be blank."]}},
            code="invalid",
        )
    if ttl is not None and ttl <= timedelta(0):
        raise ApplicationError("expires_in_days: must be at least 1", code="invalid")
    ttl = None if no_expiry else (ttl or default_token_ttl())
    digest, secret = get_digest_token(settings.COSTLAB_API_TOKEN_PREFIX)
    token = ApiToken(
        tenant=tenant,
        name=name[:80],
        created_by=created_by,
        digest=digest,
        token_key=secret[: CONSTANTS.TOKEN_KEY_LENGTH],
        expiry=timezone.now() + ttl if ttl else None,
    )
    token.full_clean()
    token.save()
    return token, secret


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke now; the row stays for audit. Revoking twice changes nothing."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
