"""Celery entry points of alerts (a delivery on its own `alerts` queue, apps/core/queues.py): each
calls one service and returns. The task names are stable: beat's schedule and the route name
them."""

from celery import shared_task

from apps.core.queues import TaskName


@shared_task(
    bind=True, name=TaskName.ALERT_DELIVER, max_retries=None, soft_time_limit=60, time_limit=90
)
def alert_deliver(self, delivery_id: int) -> None:
    """Send one alert; the service says whether and when to try again (backoff, attempts capped)."""
    from apps.alerts.services import alert_attempt

    outcome = alert_attempt(delivery_id=delivery_id)
    if outcome.retry_in_s is not None:
        raise self.retry(countdown=outcome.retry_in_s)


@shared_task(name=TaskName.ALERTS_REQUEUE_STALE, time_limit=60)
def alerts_requeue_stale() -> None:
    """Beat: pending alerts whose task never ran are queued again."""
    from apps.alerts.services import deliveries_requeue_stale

    deliveries_requeue_stale()
