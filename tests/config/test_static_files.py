"""Static files as served after collectstatic (make run, the Docker image): hashed names, gzip, and
cache headers that let a browser keep plotly.js for good; hashed URLs in pages even with DEBUG on."""

import re

import pytest
from django.core.management import call_command

from tests.apps.dashboard.world import world

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def test_pages_link_hashed_files_served_gzipped_and_cached_for_good(client, settings, tmp_path):
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {"BACKEND": "apps.core.staticfiles.HashedStaticStorage"}}
    settings.WHITENOISE_USE_FINDERS = False
    settings.WHITENOISE_AUTOREFRESH = False
    # The dashboard's own files and plotly.js (the admin's and Swagger's are collected the same way).
    call_command("collectstatic", "--noinput", verbosity=0, ignore_patterns=["admin", "rest_framework", "drf_spectacular_sidecar"])
    assert sorted(p.name for p in (tmp_path / "plotly").iterdir() if ".min." in p.name and "js" in p.name)[:1], \
        "plotly.min.js collected"
    assert not (tmp_path / "plotly" / "datasets").exists(), "only plotly.js of the plotly package"

    w = world()
    client.force_login(w.user)
    settings.DEBUG = True  # make run: hashed URLs all the same
    html = client.get(f"/experiments/{w.experiment.pk}/").content.decode()
    plotly = re.search(r'src="(/static/plotly/plotly\.min\.[0-9a-f]{12}\.js)"', html)
    css = re.search(r'href="(/static/dashboard/dashboard\.[0-9a-f]{12}\.css)"', html)
    assert plotly and css, "pages link content-hashed names"
    settings.DEBUG = False

    response = client.get(plotly.group(1), HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert int(response["Content-Length"]) < 2_000_000, "4.8 MB of plotly.js travels as about 1.5 MB"
    cache = response["Cache-Control"]
    assert "immutable" in cache and int(re.search(r"max-age=(\d+)", cache).group(1)) >= 365 * 86400
    plain = client.get("/static/plotly/plotly.min.js")
    assert plain.status_code == 200 and "immutable" not in plain["Cache-Control"], \
        "an unhashed name may change: not cached for good"


def test_plotly_finder_finds_plotly_js_only():
    from django.contrib.staticfiles import finders

    assert finders.find("plotly/plotly.min.js").endswith("plotly.min.js")
    assert finders.find("plotly/plotly.min.js", find_all=True)[0].endswith("plotly.min.js")
    assert finders.find("plotly/datasets/iris.csv.gz") is None, "the package's sample data is not served"
    assert finders.find("plotly/nope.js", find_all=True) == []
