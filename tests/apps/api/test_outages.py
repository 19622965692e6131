"""Outages degrade the API, never into a 500: Redis down (nothing listens where the throttle's
cache points) still serves requests under a local limit, and Postgres down answers 503 JSON."""

from __future__ import annotations

import json
import logging

import pytest

from apps.api import throttles
from tests.helpers import clean_env, run_python

pytestmark = pytest.mark.django_db

CLOSED_PORT_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def redis_down(settings):
    settings.CACHES = {
        **settings.CACHES,
        "unreachable": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CLOSED_PORT_REDIS,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        },
    }
    settings.COSTLAB_API_THROTTLE_CACHE = "unreachable"
    throttles._last_fallback_log = 0.0


def test_redis_down_the_api_still_answers_and_logs_the_fallback(
    api, experiment, redis_down, caplog
):
    with caplog.at_level(logging.WARNING, logger="apps.api.throttles"):
        listed = api.get("/api/v1/experiments/")
        read = api.get(f"/api/v1/experiments/{experiment.pk}/")
    assert listed.status_code == 200, listed.content
    assert read.status_code == 200
    assert "throttle: cache 'unreachable' unreachable" in caplog.text
    assert caplog.text.count("throttle: cache") == 1  # logged once, not per request


def test_redis_down_the_local_limit_still_applies(api, redis_down, settings):
    settings.COSTLAB_API_THROTTLE_RATES = {**settings.COSTLAB_API_THROTTLE_RATES, "client": "3/min"}
    codes = [api.get("/api/v1/experiments/").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]


def test_redis_down_anonymous_and_bad_tokens_are_refused_not_500(client, redis_down):
    assert client.get("/api/v1/experiments/").status_code in (401, 403)
    bad = client.get("/api/v1/experiments/", HTTP_AUTHORIZATION="Bearer clb_nottherightone")
    assert bad.status_code == 401


POSTGRES_DOWN = (
    "import django, json; django.setup(); from django.test import Client; "
    "c = Client(HTTP_HOST='localhost'); "
    "r = c.get('/api/v1/experiments/', HTTP_AUTHORIZATION='Bearer clb_whatever'); "
    "print(json.dumps({'status': r.status_code, 'retry': r.get('Retry-After'), 'body': r.json()}))"
)


@pytest.mark.slow
def test_postgres_down_is_a_503_json_with_retry_after(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path),
        DATABASE_URL="postgres://postgres@127.0.0.1:1/nothing",
    )
    out = run_python(POSTGRES_DOWN, env)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["status"] == 503 and shown["retry"] == "5"
    assert shown["body"]["error"]["code"] == "service_unavailable"
    assert shown["body"]["error"]["message"].startswith("database: ")
    assert "127.0.0.1" not in json.dumps(
        shown["body"]
    )  # no host, port or driver text to the caller


@pytest.mark.django_db(transaction=True)  # the request commits, so the enqueue runs inside it
def test_broker_down_a_submission_is_kept_and_answered_not_500(api, experiment):
    from apps.experiments.models import Run
    from config.celery_app import app

    original = app.conf.broker_url
    app.conf.broker_url = CLOSED_PORT_REDIS
    try:
        response = api.post("/api/v1/runs/", {"experiment": experiment.pk}, format="json")
    finally:
        app.conf.broker_url = original
    assert response.status_code == 201, response.content
    assert (
        Run.objects.filter(status="queued").count() == 1
    )  # the row is the truth; the reconciler re-sends
