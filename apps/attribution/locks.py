"""Single-flight: one attribution tick at a time, whatever the database.

Call inside a transaction; the lock is released when the transaction ends, so a crashed tick
cannot leave it held. Which database is in use is apps.core.db's business.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from apps.attribution.models import AttributionLock
from apps.core.db import advisory_xact_lock_try


def lock_try(name: str) -> bool:
    """Take the named lock for the current transaction; False when another transaction holds it."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_try must be called inside transaction.atomic()")
    taken = advisory_xact_lock_try(name)
    if taken is not None:
        return taken
    # SQLite has one writer at a time: writing the lock row takes the database's write lock for
    # the rest of this transaction, so a second tick waits here (busy timeout), then runs after
    # the first has committed and finds nothing due. Other databases: the row lock does the same.
    AttributionLock.objects.get_or_create(name=name)
    AttributionLock.objects.filter(name=name).update(acquired_at=timezone.now())
    return True
