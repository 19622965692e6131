"""Static files as served: content-hashed names, gzip beside each, cached by browsers for good.

whitenoise's CompressedManifestStaticFilesStorage (collectstatic writes `name.<hash>.ext` and
`.gz` copies; whitenoise serves the hashed names with `Cache-Control: max-age=315360000,
immutable`), with one change: templates get the hashed URL even when DEBUG is on (DJANGO_DEBUG=true;
`make run` runs without it), so every page caches plotly.js (frontend/static/plotly/: 1.1 MB, 0.37
MB gzipped) once per browser as production does. Any change to a static file is a new name, so a
cached copy is never stale; it needs collectstatic, which `make run`, the Docker image and the
benchmarks run (a file not collected is linked by its plain name, which whitenoise serves from the
sources under DEBUG, uncached).
"""

from __future__ import annotations

from pathlib import Path

from django.contrib.staticfiles.storage import StaticFilesStorage
from whitenoise.storage import CompressedManifestStaticFilesStorage


class HashedStaticStorage(CompressedManifestStaticFilesStorage):
    def url(self, name, force=False):
        try:
            return super().url(name, force=True)
        except (
            ValueError
        ):  # not collected (a bare `manage.py runserver`): the plain name, served uncached
            return StaticFilesStorage.url(self, name)


def static_collect_if_stale() -> bool:
    """Run collectstatic when the storage serves from a manifest and the manifest is missing or
    older than a source file (make run, the benchmarks); True when it ran. A no-op under the test
    settings."""
    from django.conf import settings
    from django.contrib.staticfiles import finders
    from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage
    from django.core.management import call_command

    if not isinstance(staticfiles_storage, ManifestFilesMixin):
        return False
    manifest = Path(settings.STATIC_ROOT) / staticfiles_storage.manifest_name
    if manifest.exists():
        collected = manifest.stat().st_mtime
        sources = (
            Path(storage.path(path))
            for finder in finders.get_finders()
            for path, storage in finder.list(["CVS", ".*", "*~"])
        )
        if all(source.stat().st_mtime <= collected for source in sources):
            return False
    call_command("collectstatic", interactive=False, verbosity=0)
    return True
