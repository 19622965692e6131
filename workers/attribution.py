"""Celery entry points of attribution: each calls one service and returns."""

from celery import shared_task


@shared_task(name="costlab.attribution_tick", soft_time_limit=50, time_limit=60)
def attribution_tick() -> None:
    """Beat: attribute every due experiment (single-flight; a second concurrent tick returns at once)."""
    from apps.attribution.services import attribution_tick as tick

    tick()


@shared_task(bind=True, name="costlab.alert_deliver", max_retries=None, soft_time_limit=60, time_limit=90)
def alert_deliver(self, delivery_id: int) -> None:
    """Send one alert; the service says whether and when to try again (backoff, attempts capped)."""
    from apps.attribution.alerts import alert_attempt

    outcome = alert_attempt(delivery_id=delivery_id)
    if outcome.retry_in_s is not None:
        raise self.retry(countdown=outcome.retry_in_s)


@shared_task(name="costlab.alerts_requeue_stale", time_limit=60)
def alerts_requeue_stale() -> None:
    """Beat: pending alerts whose task never ran are queued again."""
    from apps.attribution.alerts import deliveries_requeue_stale

    deliveries_requeue_stale()
