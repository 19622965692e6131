"""Database calls that must survive a dropped connection (a worker's main path)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)

T = TypeVar("T")


def db_retry(fn: Callable[..., T], /, *, what: str, budget_s: float | None = None, **kwargs) -> T:
    """Call fn(**kwargs); on a lost or refused connection close it, back off and try again for up to budget_s.

    A connection kept since the task began (CONN_MAX_AGE) may have died with a database restart; Django
    only learns it on the next query. fn must be safe to repeat: the services it wraps are idempotent
    for the same owner (a claim or finish that committed before the answer was lost is seen as done).
    """
    budget = settings.COSTLAB_WORKER_DB_RETRY_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    delay, tries = 0.25, 0
    while True:
        tries += 1
        try:
            return fn(**kwargs)
        except (OperationalError, InterfaceError) as exc:
            connection.close()  # a fresh connection next time, never the dead one
            left = deadline - time.monotonic()
            if left <= 0:
                logger.error("%s: database unreachable for %.0f s (%d tries), giving up: %s", what, budget, tries, exc)
                raise
            logger.warning("%s: database call failed (%s: %s); retrying in %.1f s (%.0f s left)", what,
                           type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                           min(delay, left), left)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
