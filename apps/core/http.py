"""The client's address, one rule for every per-address limit (API throttles, sign-in lockouts)."""

from __future__ import annotations

from rest_framework.throttling import BaseThrottle


def client_address(request) -> str | None:
    """REMOTE_ADDR, or the address COSTLAB_API_NUM_PROXIES hops back in X-Forwarded-For."""
    return BaseThrottle().get_ident(request)
