"""/healthz: anonymous callers learn only ok/degraded; staff and the ops token get which service is
down and why. 503 when the database or the broker is down."""

import json

import pytest

from config.celery_app import app as celery_app
from tests.factories import UserFactory
from tests.helpers import clean_env, run_python

pytestmark = pytest.mark.django_db

OPS_TOKEN = "ops-test-token-0123456789"


@pytest.fixture
def broker_down():
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    yield
    celery_app.conf.broker_url = original


def test_anonymous_gets_only_ok_when_everything_is_up(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_anonymous_gets_only_degraded_when_the_broker_is_down(client, broker_down):
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "degraded"}  # no driver error, host or port
    assert b"127.0.0.1" not in response.content and b"Error" not in response.content


def test_staff_see_which_service_is_down_and_why(client, broker_down):
    client.force_login(UserFactory(is_staff=True))
    body = client.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is False and body["broker"]["detail"]


def test_a_signed_in_user_who_is_not_staff_is_anonymous_here(client, broker_down):
    client.force_login(UserFactory(is_staff=False))
    assert client.get("/healthz").json() == {"status": "degraded"}


def test_the_ops_token_sees_the_details(client, settings):
    settings.COSTLAB_OPS_TOKEN = OPS_TOKEN
    assert "database" in client.get("/healthz", HTTP_AUTHORIZATION=f"Bearer {OPS_TOKEN}").json()
    assert client.get("/healthz", HTTP_AUTHORIZATION="Bearer wrong").json() == {"status": "ok"}


@pytest.mark.slow
def test_database_down_is_degraded_and_the_token_still_sees_why(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path),
        DATABASE_URL="postgres://postgres@127.0.0.1:1/nothing",
        COSTLAB_OPS_TOKEN=OPS_TOKEN,
    )
    code = (
        "import django, json; django.setup(); from django.test import Client; "
        "c = Client(HTTP_HOST='localhost'); "
        "r = c.get('/healthz'); print(r.status_code); print(r.content.decode()); "
        f"print(c.get('/healthz', HTTP_AUTHORIZATION='Bearer {OPS_TOKEN}').content.decode())"
    )
    out = run_python(code, env)
    assert out.returncode == 0, out.stderr
    status, anonymous, detailed = out.stdout.strip().splitlines()[-3:]
    assert status == "503"
    assert json.loads(anonymous) == {"status": "degraded"}
    detailed = json.loads(detailed)
    assert detailed["database"]["ok"] is False and detailed["database"]["detail"]
