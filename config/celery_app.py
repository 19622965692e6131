"""The Celery application: configuration from Django settings (CELERY_*)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("costlab", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Autodiscovery only finds <app>.tasks; the workers package is registered explicitly.
app.autodiscover_tasks()
app.conf.imports = ("workers.tasks", "workers.attribution", "workers.sweeps")
