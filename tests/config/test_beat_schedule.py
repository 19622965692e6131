"""Beat's entries reach django-celery-beat's tables with an expiry it honours: a tick that waited
longer than its interval is dropped by the worker, not run late on top of the next one."""

import pytest
from django.conf import settings
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

from config.celery_app import app

pytestmark = pytest.mark.django_db(transaction=True)  # the scheduler closes connections


def test_every_beat_entry_expires_before_its_next_run():
    DatabaseScheduler(
        app=app
    )  # what `celery beat` does at start: sync CELERY_BEAT_SCHEDULE into the tables
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        task = PeriodicTask.objects.get(name=name)
        assert task.expire_seconds is not None, (
            f"{name}: no expire_seconds, stale runs would pile up"
        )
        assert 0 < task.expire_seconds < entry["schedule"], name
    tick = DatabaseScheduler(app=app).schedule["attribution-tick"]
    assert (
        tick.options["expires"] == PeriodicTask.objects.get(name="attribution-tick").expire_seconds
    )


def test_alert_deliveries_are_routed_off_the_ticks_queue():
    from apps.core.queues import CeleryQueue

    route = app.amqp.router.route({}, "costlab.alert_deliver")
    assert route["queue"].name == CeleryQueue.ALERTS
    assert (
        app.amqp.router.route({}, "costlab.attribution_tick")["queue"].name == CeleryQueue.DEFAULT
    )
