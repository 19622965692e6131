"""Celery entry points. Each task validates, calls one service, and returns."""

from celery import shared_task


@shared_task(name="costlab.ping", ignore_result=False, time_limit=10)
def ping() -> str:
    """Liveness probe: answers 'pong' from whichever worker takes it."""
    return "pong"
