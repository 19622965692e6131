"""Celery entry points of attribution: each calls one service and returns."""

from celery import shared_task

from apps.core.queues import TaskName


@shared_task(name=TaskName.ATTRIBUTION_TICK, soft_time_limit=50, time_limit=60)
def attribution_tick() -> None:
    """Beat: attribute every due experiment
    (single-flight; a second concurrent tick returns at once)."""
    import time

    from django.utils import timezone

    from apps.attribution.services import attribution_tick as tick
    from apps.core.services import periodic_task_run_record

    started_at, t0 = timezone.now(), time.perf_counter()
    try:
        tick()
    finally:  # duration and lag for /metrics, whether or not the tick succeeded
        periodic_task_run_record(
            name="attribution_tick", started_at=started_at, duration_s=time.perf_counter() - t0
        )
