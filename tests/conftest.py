"""Suite-wide fixtures and the rule for real services.

Postgres and Redis are used when reachable (config.settings.test decides). Tests
marked `services` need both: without them they are skipped with the reason, except
under CI=true, where a missing service fails the run.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def services_missing() -> list[str]:
    missing = []
    if not getattr(settings, "USING_POSTGRES", False):
        missing.append("Postgres (set DATABASE_URL or run one on 127.0.0.1:5432)")
    if not settings.REDIS_URL:
        missing.append("Redis (set REDIS_URL or run one on 127.0.0.1:6379)")
    return missing


def pytest_configure(config):
    missing = services_missing()
    if IN_CI and missing:
        raise pytest.UsageError("CI=true but these services are unreachable: " + "; ".join(missing))


def pytest_collection_modifyitems(config, items):
    missing = services_missing()
    cuda = None
    for item in items:
        if missing and item.get_closest_marker("services"):
            item.add_marker(pytest.mark.skip(reason="needs a real service: " + "; ".join(missing)))
        if item.get_closest_marker("cuda"):
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device; none here"))


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup, django_db_blocker):
    """A real Celery worker in its own process, on the test broker and the test database.

    Tests that use it must commit what the worker should see (transactional_db).
    """
    import subprocess
    import sys
    import time
    import uuid

    from django.db import connection

    from config.celery_app import app as celery_app
    from tests.helpers import ROOT, clean_env

    missing = services_missing()
    if missing:
        pytest.skip("a real worker needs: " + "; ".join(missing))
    db = connection.settings_dict
    database_url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    name = f"test-{uuid.uuid4().hex[:8]}@localhost"
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.test", DATABASE_URL=database_url, REDIS_URL=settings.REDIS_URL
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config.celery_app", "worker", "--pool", "solo",
         "--queues", "default,cpu,gpu", "--hostname", name, "--without-gossip", "--without-mingle",
         "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("celery worker exited at start:\n" + proc.stdout.read())
        if celery_app.control.ping(destination=[name], timeout=1.0):
            break
    else:
        proc.kill()
        pytest.fail("celery worker did not answer a ping within 60 s")
    yield name
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
