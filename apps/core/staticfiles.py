"""Static files as served: content-hashed names, gzip beside each, cached by browsers for good.

whitenoise's CompressedManifestStaticFilesStorage (collectstatic writes `name.<hash>.ext` and
`.gz` copies; whitenoise serves the hashed names with `Cache-Control: max-age=315360000,
immutable`), with one change: templates get the hashed URL even when DEBUG is on, so `make run`
(DEBUG) caches plotly.js (4.8 MB, 1.4 MB gzipped) once per browser as production does. Any
change to a static file is a new name, so a cached copy is never stale; it needs collectstatic,
which `make run`, the Docker image and the benchmarks run.
"""

from __future__ import annotations

from pathlib import Path

from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage
from whitenoise.storage import CompressedManifestStaticFilesStorage


class HashedStaticStorage(CompressedManifestStaticFilesStorage):
    def url(self, name, force=False):
        return super().url(name, force=True)


class PlotlyFinder(BaseFinder):
    """`plotly/plotly.min.js` from the installed plotly package (no CDN), and nothing else of its
    package data (sample datasets, templates: 5 MB that no page uses)."""

    NAME = "plotly.min.js"
    PREFIX = "plotly"

    def __init__(self, *args, **kwargs):
        import plotly

        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=Path(plotly.__file__).parent / "package_data")
        self.storage.prefix = self.PREFIX

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        find_all = find_all or kwargs.get("all", False)
        if path != f"{self.PREFIX}/{self.NAME}":
            return []  # as Django's finders answer "no match", whatever find_all says
        match = self.storage.path(self.NAME)
        return [match] if find_all else match

    def list(self, ignore_patterns):
        yield self.NAME, self.storage


def static_collect_if_stale() -> bool:
    """Run collectstatic when the storage serves from a manifest and the manifest is missing or older
    than a source file (make run, the benchmarks); True when it ran. A no-op under the test settings."""
    from django.conf import settings
    from django.contrib.staticfiles import finders
    from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage
    from django.core.management import call_command

    if not isinstance(staticfiles_storage, ManifestFilesMixin):
        return False
    manifest = Path(settings.STATIC_ROOT) / staticfiles_storage.manifest_name
    if manifest.exists():
        collected = manifest.stat().st_mtime
        sources = (Path(storage.path(path)) for finder in finders.get_finders()
                   for path, storage in finder.list(["CVS", ".*", "*~"]))
        if all(source.stat().st_mtime <= collected for source in sources):
            return False
    call_command("collectstatic", interactive=False, verbosity=0)
    return True
