"""Static files as served after collectstatic (make run, the Docker image): hashed names, gzip, and
cache headers that let a browser keep plotly.js for good; hashed URLs in pages even with DEBUG on.
plotly.js is its basic bundle, at the Python package's version, and covers every trace type
drawn."""

import re
from pathlib import Path

import plotly
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from tests.apps.dashboard.world import world

STATIC = Path(django_settings.BASE_DIR) / "frontend" / "static"
BASIC = STATIC / "plotly" / "plotly-basic.min.js"
BASIC_TRACES = {"scatter", "bar", "pie"}  # what plotly.js's basic bundle registers


@pytest.mark.slow
@pytest.mark.django_db
def test_pages_link_hashed_files_served_gzipped_and_cached_for_good(client, settings, tmp_path):
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "apps.core.staticfiles.HashedStaticStorage"},
    }
    settings.WHITENOISE_USE_FINDERS = False
    settings.WHITENOISE_AUTOREFRESH = False
    # The dashboard's own files (the admin's and Swagger's are collected the same way, only slower).
    call_command(
        "collectstatic",
        "--noinput",
        verbosity=0,
        ignore_patterns=["admin", "rest_framework", "drf_spectacular_sidecar"],
    )

    w = world()
    client.force_login(w.user)
    settings.DEBUG = True  # make run: hashed URLs all the same
    html = client.get(f"/experiments/{w.experiment.pk}/").content.decode()
    # lazy.js runs plotly.js after the load event: the page names it in lazy.js's data-plotly
    # (and prefetches it), both with the hashed name.
    hashed = r"/static/plotly/plotly-basic\.min\.[0-9a-f]{12}\.js"
    plotly_js = re.search(rf'data-plotly="({hashed})"', html)
    prefetch = re.search(rf'rel="prefetch" href="({hashed})"', html)
    css = re.search(r'href="(/static/dashboard/dashboard\.[0-9a-f]{12}\.css)"', html)
    assert plotly_js and prefetch and css, "pages link content-hashed names"
    assert prefetch.group(1) == plotly_js.group(1)
    settings.DEBUG = False

    response = client.get(plotly_js.group(1), HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert int(response["Content-Length"]) < 500_000, "1.1 MB of plotly.js travels as about 0.37 MB"
    cache = response["Cache-Control"]
    assert "immutable" in cache and int(re.search(r"max-age=(\d+)", cache).group(1)) >= 365 * 86400
    plain = client.get("/static/plotly/plotly-basic.min.js")
    assert plain.status_code == 200 and "immutable" not in plain["Cache-Control"], (
        "an unhashed name may change: not cached for good"
    )


def plotly_version(path: Path) -> str:
    with path.open(encoding="utf-8") as f:
        return re.search(r"plotly\.js .*?v(\d+\.\d+\.\d+)", f.read(400)).group(1)


def test_the_basic_bundle_is_the_python_packages_plotly_js():
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert "(basic" in BASIC.read_text(encoding="utf-8")[:200]
    assert plotly_version(BASIC) == plotly_version(full), (
        "the plotly pin moved: replace frontend/static/plotly/plotly-basic.min.js "
        "with that version's basic bundle"
    )


def test_every_trace_type_drawn_is_in_the_basic_bundle():
    scripts = [p for p in STATIC.rglob("*.js") if p.parent.name != "plotly"]
    assert scripts
    drawn = set()
    for script in scripts:
        # traces: {type: "scatter", mode: ...}, {type: "bar", orientation: ...}; not axes ("date")
        # or shapes ("line")
        drawn |= set(
            re.findall(
                r'type:\s*"(\w+)",\s*(?:mode|orientation|x|y|name|stackgroup|marker|hovertemplate|text)\s*:',
                script.read_text(encoding="utf-8"),
            )
        )
    assert drawn, "found the traces"
    assert drawn <= BASIC_TRACES, f"{drawn - BASIC_TRACES}: not in plotly.js's basic bundle"
