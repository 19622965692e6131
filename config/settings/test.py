"""Test settings.

Postgres and Redis when reachable: the URLs in DATABASE_URL / REDIS_URL, or the localhost
defaults when those are unset. A configured URL that does not answer is dropped (SQLite,
an in-process broker) and recorded in COSTLAB_TEST_UNREACHABLE, so tests that need the
service skip with one message naming it, and under CI=true the run fails at once
(tests/conftest.py). Tests keep their state in var/test/, never in make run's var/.
"""

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

POSTGRES_DEFAULT = "postgres://postgres@127.0.0.1:5432/costlab"
REDIS_DEFAULT = "redis://127.0.0.1:6379/15"
DEFAULT_PORTS = {"DATABASE_URL": 5432, "REDIS_URL": 6379}


def _address(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def _reachable(url: str, default_port: int) -> bool:
    try:
        with socket.create_connection(_address(url, default_port), timeout=0.5):
            return True
    except OSError:
        return False


# A configured URL that does not answer: "<VAR> (host:port): unreachable"; no credentials shown.
COSTLAB_TEST_UNREACHABLE: list[str] = []
for _var, _default in (("DATABASE_URL", POSTGRES_DEFAULT), ("REDIS_URL", REDIS_DEFAULT)):
    if _var in os.environ:
        if not _reachable(os.environ[_var], DEFAULT_PORTS[_var]):
            _host, _port = _address(os.environ[_var], DEFAULT_PORTS[_var])
            COSTLAB_TEST_UNREACHABLE.append(
                f"{_var} is set ({_host}:{_port}) but nothing answers there"
            )
            del os.environ[_var]
    elif _reachable(_default, DEFAULT_PORTS[_var]):
        os.environ[_var] = _default
# pytest-xdist: each worker (gw0, gw1, ...) gets a Redis db, a test database (pytest-django adds
# the suffix) and a var dir of its own, so parallel workers never see each other's queues, runs or
# files. Applied once: processes that tests start inherit the worker's values, not a second shift.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if XDIST_WORKER and not os.environ.get("COSTLAB_TEST_ISOLATED"):
    os.environ["COSTLAB_TEST_ISOLATED"] = XDIST_WORKER
    _index = int(XDIST_WORKER.removeprefix("gw") or 0)
    if "REDIS_URL" in os.environ:
        _parts = urlsplit(os.environ["REDIS_URL"])
        _db = int(_parts.path.lstrip("/") or 0)
        _db = (_db - _index) % 16  # 15, 14, 13 ... for gw0, gw1, gw2 from the default db 15
        os.environ["REDIS_URL"] = _parts._replace(path=f"/{_db}").geturl()
    os.environ["COSTLAB_VAR_DIR"] = str(
        Path(
            os.environ.get(
                "COSTLAB_VAR_DIR", Path(__file__).resolve().parent.parent.parent / "var" / "test"
            )
        )
        / XDIST_WORKER
    )
if "REDIS_URL" not in os.environ:
    os.environ["COSTLAB_EMBEDDED_REDIS"] = (
        "false"  # nobody starts one for tests: an in-process broker
    )
# Exported, so the worker and stack processes that tests start share it.
os.environ.setdefault(
    "COSTLAB_VAR_DIR", str(Path(__file__).resolve().parent.parent.parent / "var" / "test")
)

from .base import *  # noqa: E402,F403
from .base import DATABASES, STORAGES, env  # noqa: E402

SECRET_KEY = env("DJANGO_SECRET_KEY", default="costlab-test-only-not-secret")
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
USING_POSTGRES = DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql")
DATABASES["default"]["CONN_MAX_AGE"] = 0
# Static files straight from the sources (no collectstatic before every test run): the live server
# serves them through Django's finders. tests/config/test_static_files.py checks what is served for
# real: collectstatic's hashed, gzipped files with far-future cache headers.
WHITENOISE_USE_FINDERS = True
STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Tests stamp samples with fixed 2026 dates, which fall out of any retention window as time goes
# by: retention is off (ingest refuses nothing as too old) unless a test turns it on
# (tests/apps/dashboard/test_retention.py).
COSTLAB_TELEMETRY_RETENTION_DAYS = 0
