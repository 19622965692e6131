"""Rate limits per API client (token), per user (session) and per address (anonymous).

Rates are read from settings on every request (COSTLAB_API_THROTTLE_RATES), so they can be
changed without re-importing; counters live in the cache named by COSTLAB_API_THROTTLE_CACHE
(Redis, so every web process shares them). When that cache cannot be reached, requests are
still served: counted in this process's memory (COSTLAB_API_THROTTLE_FALLBACK_CACHE) with the
same rates, and the outage logged at most once a minute.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import caches
from redis.exceptions import RedisError
from rest_framework.throttling import SimpleRateThrottle

from apps.api.models import ApiToken

logger = logging.getLogger(__name__)
_last_fallback_log = 0.0


def _log_fallback(exc: Exception) -> None:
    global _last_fallback_log
    if time.monotonic() - _last_fallback_log >= 60:
        _last_fallback_log = time.monotonic()
        logger.warning(
            "throttle: cache %r unreachable (%s: %s); counting in this process's memory instead",
            settings.COSTLAB_API_THROTTLE_CACHE,
            type(exc).__name__,
            exc,
        )


class ClientRateThrottle(SimpleRateThrottle):
    scope = "client"

    def __init__(self):
        self.cache = caches[settings.COSTLAB_API_THROTTLE_CACHE]
        super().__init__()

    def get_rate(self):
        return settings.COSTLAB_API_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except (
            RedisError,
            OSError,
        ) as exc:  # the shared counters are down: a local limit, not a 500
            _log_fallback(exc)
            self.cache = caches[settings.COSTLAB_API_THROTTLE_FALLBACK_CACHE]
            return super().allow_request(request, view)

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
