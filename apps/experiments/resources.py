"""The cloud resource a run trained on (Run.resource_id): the one rule for what an id may be.

A worker records it from COSTLAB_RESOURCE_ID (workers.training); an external run may send it at
submit (the API, the SDK). It is matched against an invoice's FOCUS ResourceId by billing's
reconciliation (apps/billing/reconcile.py), so it is the id as the cloud writes it there: an AWS
instance id or ARN, an Azure resource id, a Google Cloud instance's path.
"""

from __future__ import annotations

import re

from apps.core.exceptions import ApplicationError

RESOURCE_ID_MAX = 512
RESOURCE_ID_CHARS = "letters, digits and - _ . : / @ + = , ~ ( )"
_ALLOWED = re.compile(r"[A-Za-z0-9._:/@+=,~()-]")


def resource_id_problem(value: str) -> str | None:
    """Why `value` is not a resource id (its length, or the first character it may not hold), or
    None. Empty is allowed: no resource recorded."""
    if len(value) > RESOURCE_ID_MAX:
        return f"at most {RESOURCE_ID_MAX} characters (got {len(value)})"
    for position, char in enumerate(value, start=1):
        if not _ALLOWED.fullmatch(char):
            return (
                f"character {char!r} at position {position} is not allowed (only "
                f"{RESOURCE_ID_CHARS})"
            )
    return None


def resource_id_check(value: str, *, field: str = "resource_id") -> str:
    """`value` stripped, or ApplicationError naming `field` and the reason."""
    value = (value or "").strip()
    problem = resource_id_problem(value)
    if problem is not None:
        raise ApplicationError(
            f"{field}: {problem}", {"fields": {field: [problem]}}, code="invalid"
        )
    return value
