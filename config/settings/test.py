"""Test settings.

Postgres and Redis when reachable (DATABASE_URL / REDIS_URL, or the localhost
defaults); otherwise SQLite and the filesystem broker, and tests that need a real
service are skipped (tests/conftest.py). Under CI=true a missing service fails.
"""

import os
import socket
from urllib.parse import urlsplit

POSTGRES_DEFAULT = "postgres://postgres@127.0.0.1:5432/costlab"
REDIS_DEFAULT = "redis://127.0.0.1:6379/15"


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), timeout=0.5):
            return True
    except OSError:
        return False


for _var, _default in (("DATABASE_URL", POSTGRES_DEFAULT), ("REDIS_URL", REDIS_DEFAULT)):
    if _var not in os.environ and _reachable(_default):
        os.environ[_var] = _default

from .base import *  # noqa: E402,F403
from .base import DATABASES, env  # noqa: E402

SECRET_KEY = env("DJANGO_SECRET_KEY", default="costlab-test-only-not-secret")
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
USING_POSTGRES = DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql")
DATABASES["default"]["CONN_MAX_AGE"] = 0
WHITENOISE_USE_FINDERS = True
