"""Single-flight: one attribution tick at a time, whatever the database.

The only place that knows which database is in use. Call inside a transaction; the lock
is released when the transaction ends, so a crashed tick cannot leave it held.
"""

from __future__ import annotations

import hashlib

from django.db import connection, transaction
from django.utils import timezone

from apps.attribution.models import AttributionLock


def _advisory_key(name: str) -> int:
    # A stable signed 64-bit key per lock name (Python's hash() changes per process).
    return int.from_bytes(hashlib.sha256(f"costlab:{name}".encode()).digest()[:8], "big", signed=True)


def lock_try(name: str) -> bool:
    """Take the named lock for the current transaction; False when another transaction holds it."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_try must be called inside transaction.atomic()")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_advisory_key(name)])
            return bool(cursor.fetchone()[0])
    # SQLite has one writer at a time: writing the lock row takes the database's write lock for
    # the rest of this transaction, so a second tick waits here (busy timeout), then runs after
    # the first has committed and finds nothing due. Other databases: the row lock does the same.
    AttributionLock.objects.get_or_create(name=name)
    AttributionLock.objects.filter(name=name).update(acquired_at=timezone.now())
    return True
