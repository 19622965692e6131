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
