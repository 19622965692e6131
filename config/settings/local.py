"""Development on a laptop: `make run`."""

from .base import *  # noqa: F403
from .base import env

# Off by default even here: a 404 or 500 shows the site's own page, not Django's debug page with the
# URL list and settings (`make run` may listen beyond localhost). DJANGO_DEBUG=true turns it on.
DEBUG = env.bool("DJANGO_DEBUG", default=False)
# A development-only key; production refuses to start without DJANGO_SECRET_KEY.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="costlab-local-development-only-not-secret")
