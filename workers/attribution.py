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


@shared_task(
    bind=True, name=TaskName.ALERT_DELIVER, max_retries=None, soft_time_limit=60, time_limit=90
)
def alert_deliver(self, delivery_id: int) -> None:
    """Send one alert; the service says whether and when to try again (backoff, attempts capped)."""
    from apps.attribution.alerts import alert_attempt

    outcome = alert_attempt(delivery_id=delivery_id)
    if outcome.retry_in_s is not None:
        raise self.retry(countdown=outcome.retry_in_s)


@shared_task(name=TaskName.ALERTS_REQUEUE_STALE, time_limit=60)
def alerts_requeue_stale() -> None:
    """Beat: pending alerts whose task never ran are queued again."""
    from apps.attribution.alerts import deliveries_requeue_stale

    deliveries_requeue_stale()
