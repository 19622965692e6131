"""Writes of the platform's own bookkeeping."""

from __future__ import annotations

from datetime import datetime

from django.db.models import F

from apps.core.models import PeriodicTaskRun


def periodic_task_run_record(*, name: str, started_at: datetime, duration_s: float) -> None:
    """Record one run of a beat task (one UPDATE in the usual case; the first run
    creates the row)."""
    updated = PeriodicTaskRun.objects.filter(name=name).update(
        last_started_at=started_at, last_duration_s=duration_s, runs=F("runs") + 1
    )
    if not updated:
        PeriodicTaskRun.objects.get_or_create(
            name=name,
            defaults={"last_started_at": started_at, "last_duration_s": duration_s, "runs": 1},
        )
