"""/healthz reports database and broker reachability; 503 when either is down."""

import json

import pytest

from config.celery_app import app as celery_app
from tests.helpers import clean_env, run_python

pytestmark = pytest.mark.django_db


def test_healthz_ok_when_database_and_broker_are_up(client):
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert body["database"]["ok"] and body["broker"]["ok"]


def test_healthz_503_when_broker_is_down(client):
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        response = client.get("/healthz")
    finally:
        celery_app.conf.broker_url = original
    body = response.json()
    assert response.status_code == 503
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is False and body["broker"]["detail"]


def test_healthz_503_when_database_is_down(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path),
        DATABASE_URL="postgres://postgres@127.0.0.1:1/nothing",
    )
    code = (
        "import django, json; django.setup(); from django.test import Client; "
        "r = Client(HTTP_HOST='localhost').get('/healthz'); print(r.status_code); print(r.content.decode())"
    )
    out = run_python(code, env)
    assert out.returncode == 0, out.stderr
    status, body = out.stdout.strip().splitlines()[-2:]
    assert status == "503"
    body = json.loads(body)
    assert body["database"]["ok"] is False and body["database"]["detail"]
    assert body["broker"]["ok"] is True  # the embedded filesystem broker is still there
