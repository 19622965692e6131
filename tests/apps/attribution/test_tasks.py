"""The Celery entry points are registered under their stable names, on beat,
and call the services."""

import pytest
from django.conf import settings

from apps.attribution.models import AttributionWindow
from config.celery_app import app
from tests.apps.attribution.lab import Lab

pytestmark = pytest.mark.django_db


def test_tasks_are_registered_under_stable_names_and_the_tick_is_on_beat():
    app.loader.import_default_modules()
    assert {
        "costlab.attribution_tick",
        "costlab.alert_deliver",
        "costlab.alerts_requeue_stale",
    } <= set(app.tasks)
    beat = settings.CELERY_BEAT_SCHEDULE["attribution-tick"]
    assert (
        beat["task"] == "costlab.attribution_tick"
        and beat["schedule"] == settings.COSTLAB_ATTRIBUTION_TICK_S
    )
    assert settings.COSTLAB_ATTRIBUTION_TICK_S <= 5  # no experiment interval may be shorter


def test_the_tick_task_attributes_due_experiments():
    lab = Lab({"control": 1.0, "b": 1.0})
    lab.step()
    app.tasks["costlab.attribution_tick"].apply()
    assert AttributionWindow.objects.filter(experiment=lab.experiment).count() == 1


def test_a_missing_delivery_returns_quietly():
    assert app.tasks["costlab.alert_deliver"].apply(args=[987654]).successful()
