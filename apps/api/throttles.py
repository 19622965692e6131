"""Rate limits per API client (token), per user (session) and per address (anonymous).

Rates are read from settings on every request (COSTLAB_API_THROTTLE_RATES), so they can be
changed without re-importing; counters live in the cache named by COSTLAB_API_THROTTLE_CACHE
(Redis when REDIS_URL is set, so every web process shares them).
"""

from __future__ import annotations

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import SimpleRateThrottle

from apps.api.models import ApiToken


class ClientRateThrottle(SimpleRateThrottle):
    scope = "client"

    def __init__(self):
        self.cache = caches[settings.COSTLAB_API_THROTTLE_CACHE]
        super().__init__()

    def get_rate(self):
        return settings.COSTLAB_API_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view):
        if isinstance(request.auth, ApiToken):
            ident = f"t{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"u{request.user.pk}"
        else:
            return None  # AnonRateThrottle's business
        return f"costlab-api:{self.scope}:{ident}"


class IngestRateThrottle(ClientRateThrottle):
    """Telemetry ingest: many small batches from running jobs, limited separately from the rest."""

    scope = "ingest"

    def allow_request(self, request, view):
        if request.method != "POST":
            return True
        return super().allow_request(request, view)


class AnonRateThrottle(ClientRateThrottle):
    scope = "anon"

    def get_cache_key(self, request, view):
        if request.user and request.user.is_authenticated:
            return None
        return f"costlab-api:{self.scope}:{self.get_ident(request)}"


class AuthFailureThrottle(ClientRateThrottle):
    """Failed token authentications, per address: a caller guessing tokens is slowed down.

    Counted by the authentication class itself (DRF checks throttles only after authentication)."""

    scope = "auth_failures"

    def get_cache_key(self, request, view):
        return f"costlab-api:{self.scope}:{self.get_ident(request)}"
