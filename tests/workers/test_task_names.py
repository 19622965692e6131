"""Celery's names are written once (apps.core.queues): every registered costlab task has a TaskName,
every TaskName is registered, and every route and beat entry names a registered task on a known
queue."""

from django.conf import settings

from apps.core.queues import CeleryQueue, TaskName
from config.celery_app import app


def test_task_names_registry_matches_the_registered_tasks():
    app.loader.import_default_modules()
    registered = {name for name in app.tasks if name.startswith("costlab.")}
    assert registered == {t.value for t in TaskName}


def test_routes_and_beat_name_registered_tasks_and_known_queues():
    names = {t.value for t in TaskName}
    for task, route in settings.CELERY_TASK_ROUTES.items():
        assert task in names and route["queue"] in {q.value for q in CeleryQueue}, (task, route)
    for entry, spec in settings.CELERY_BEAT_SCHEDULE.items():
        assert spec["task"] in names, entry
