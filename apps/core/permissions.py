"""Who may see operational detail (/healthz details, /metrics): staff, or the ops token."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db import DatabaseError


def ops_caller(request) -> bool:
    """True for `Authorization: Bearer <COSTLAB_OPS_TOKEN>` or a signed-in staff user.

    The token is checked first: it needs no database, so it still works while Postgres is down."""
    token = settings.COSTLAB_OPS_TOKEN
    header = request.headers.get("Authorization", "")
    if (
        token
        and header.startswith("Bearer ")
        and hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    ):
        return True
    try:
        return bool(request.user.is_authenticated and request.user.is_staff)
    except DatabaseError:  # the session cannot be read: treated as anonymous
        return False
