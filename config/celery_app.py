"""The Celery application: configuration from Django settings (CELERY_*)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
# Django's system checks run where a deploy starts, in `migrate` (make run, compose), and in the
# suite (tests/config/test_settings.py), not again as every worker starts: Celery's Django fixup
# would run them all, importing every URLconf and view. A worker's start: 1.52 -> 1.26 CPU-s
# (AMD EPYC, 2 cores, bf16 emulated (slow)).
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("costlab", task_cls="celery.contrib.django.task:DjangoTask")
# The default app in every thread (not only this one): apps reach Celery through celery.current_app,
# which would otherwise fall back to an unconfigured app in a request thread or a worker's helper
# thread.
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
# Autodiscovery only finds <app>.tasks; the workers package is registered explicitly.
app.autodiscover_tasks()
app.conf.imports = ("workers.tasks", "workers.attribution", "workers.alerts", "workers.sweeps")
