"""Who is calling: a tenant's API token (Authorization: Bearer <token>) or a dashboard session."""

from __future__ import annotations

import binascii
from datetime import timedelta
from hmac import compare_digest
from typing import NoReturn

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.crypto import hash_token
from knox.settings import CONSTANTS
from rest_framework import authentication, exceptions

from apps.api.models import ApiToken
from apps.api.throttles import AuthFailureThrottle
from apps.core.db import Compiled

LAST_USED_RESOLUTION = timedelta(minutes=1)  # at most one write per token per minute


class ApiClient:
    """The principal behind a token: acts for its tenant with member rights; never staff."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = id = None

    def __init__(self, token: ApiToken):
        self.token = token
        self.username = f"token:{token.name}"

    def __str__(self) -> str:
        return self.username

    def has_perm(self, perm, obj=None) -> bool:
        return False


# Every API request reads its token: compiled once (apps.core.db.Compiled).
_TOKENS = Compiled(
    lambda token_key: ApiToken.objects.filter(token_key=token_key).select_related("tenant")
)


class TenantTokenAuthentication(authentication.BaseAuthentication):
    """Knox-style digests, looked up by the token's first characters; refuses revoked or expired
    tokens."""

    keywords = (b"bearer", b"token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in self.keywords:
            return None
        if len(header) != 2:
            self._refuse(
                request, "Authorization: expected 'Bearer <token>' with no spaces in the token"
            )
        try:
            secret = header[1].decode("ascii")
        except UnicodeDecodeError:
            self._refuse(request, "Authorization: the token is not ASCII")
        token = self._token(secret)
        now = timezone.now()
        if token is None:
            self._refuse(request, "invalid token")
        if token.revoked_at is not None:
            self._refuse(request, f"token '{token.name}' was revoked")
        if token.expiry is not None and token.expiry <= now:
            self._refuse(
                request, f"token '{token.name}' expired at {token.expiry:%Y-%m-%d %H:%M} UTC"
            )
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return ApiClient(token), token

    @staticmethod
    def _token(secret: str) -> ApiToken | None:
        try:
            digest = hash_token(secret)
        except (TypeError, ValueError, binascii.Error):
            return None
        for token in _TOKENS.all(token_key=secret[: CONSTANTS.TOKEN_KEY_LENGTH]):
            if compare_digest(digest, token.digest):
                return token
        return None

    @staticmethod
    def _refuse(request, message: str) -> NoReturn:
        """401, or 429 once this address has failed too often
        (COSTLAB_API_THROTTLE_RATES['auth_failures'])."""
        throttle = AuthFailureThrottle()
        if not throttle.allow_request(request, None):
            raise exceptions.Throttled(
                wait=throttle.wait(),
                detail="authentication: too many failed attempts from this address",
            )
        raise exceptions.AuthenticationFailed(message)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="costlab"'


class TenantTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.api.auth.TenantTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant's API token: "
            "`python manage.py api_token_create --tenant SLUG --name ci`.",
        }
