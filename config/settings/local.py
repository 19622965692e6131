"""Development on a laptop: `make run`."""

from .base import *  # noqa: F403
from .base import env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
# A development-only key; production refuses to start without DJANGO_SECRET_KEY.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="costlab-local-development-only-not-secret")
