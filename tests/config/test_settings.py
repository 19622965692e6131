"""Settings pick the mode from the environment alone."""

import json
import secrets

import pytest

from tests.helpers import ROOT, clean_env, run_python

pytestmark = pytest.mark.slow  # each test starts a Python process

SHOW = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({'engine': s.DATABASES['default']['ENGINE'], "
    "'db': str(s.DATABASES['default']['NAME']),"
    " 'broker': s.CELERY_BROKER_URL, 'backend': s.CELERY_RESULT_BACKEND, 'redis': s.REDIS_URL}))"
)


def test_empty_env_means_sqlite_and_the_embedded_redis_under_var(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local", COSTLAB_VAR_DIR=str(tmp_path / "var")
    )
    out = run_python(SHOW, env)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["engine"] == "django.db.backends.sqlite3"
    assert shown["db"].startswith(str(tmp_path / "var"))
    socket = tmp_path / "var" / "redis" / "redis.sock"
    assert shown["broker"] == shown["backend"] == f"redis+socket://{socket}"
    assert (
        shown["redis"] == f"unix://{socket}?db=0"
    )  # cache, pub/sub: the production Redis code path


def test_a_var_dir_too_deep_for_a_unix_socket_gets_a_short_socket_path(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    env = clean_env(DJANGO_SETTINGS_MODULE="config.settings.local", COSTLAB_VAR_DIR=str(deep))
    shown = json.loads(run_python(SHOW, env).stdout.strip().splitlines()[-1])
    path = shown["broker"].removeprefix("redis+socket://")
    assert len(path) <= 100 and path.endswith(".sock")


def test_service_urls_mean_postgres_and_redis(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path / "var"),
        DATABASE_URL="postgres://someone@db.internal:5432/costlab",
        REDIS_URL="redis://cache.internal:6379/0",
    )
    shown = json.loads(run_python(SHOW, env).stdout.strip().splitlines()[-1])
    assert shown["engine"] == "django.db.backends.postgresql"
    assert shown["broker"] == shown["backend"] == "redis://cache.internal:6379/0"


def test_production_refuses_to_start_without_secret_key(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.production", COSTLAB_VAR_DIR=str(tmp_path)
    )
    out = run_python("import django; django.setup()", env)
    assert out.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in out.stderr


def test_production_deploy_check_is_clean(tmp_path):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        COSTLAB_VAR_DIR=str(tmp_path),
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
    )
    out = run_python(
        "import sys; from django.core.management import execute_from_command_line as m; "
        "m(['manage.py', 'check', '--deploy', '--fail-level', 'WARNING'])",
        env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (ROOT / "manage.py").exists()


@pytest.mark.parametrize("value", ["0", "-5", "301", "soon"])
def test_a_send_cadence_out_of_range_refuses_to_start_naming_the_key(tmp_path, value):
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path / "var"),
        COSTLAB_TELEMETRY_SEND_EVERY_S=value,
    )
    out = run_python("import django; django.setup()", env)
    assert out.returncode != 0 and "COSTLAB_TELEMETRY_SEND_EVERY_S" in out.stderr, out.stderr[-800:]
