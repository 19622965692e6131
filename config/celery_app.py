"""The Celery application: configuration from Django settings (CELERY_*)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("costlab", task_cls="celery.contrib.django.task:DjangoTask")
# The default app in every thread (not only this one): apps reach Celery through celery.current_app,
# which would otherwise fall back to an unconfigured app in a request thread or a worker's helper
# thread.
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
# Autodiscovery only finds <app>.tasks; the workers package is registered explicitly.
app.autodiscover_tasks()
app.conf.imports = ("workers.tasks", "workers.attribution", "workers.sweeps")
