"""The web surface outside the pages themselves: headers, the API root, the favicon, the site's own
error pages, the admin's wording, and the stylesheet that keeps Plotly within the CSP."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from apps.dashboard.plotly_css import STYLESHEET, plotly_css
from apps.pricing.models import PricingTable
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_every_page_has_a_strict_csp(member, w):
    for url in ("/", f"/experiments/{w.experiment.pk}/", "/pricing/", "/login/"):
        policy = member.get(url)["Content-Security-Policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
        assert directives["script-src"] == "'self'", policy
        assert directives["style-src"] == "'self'", policy
        assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'", (
            policy
        )


def test_api_root_lists_the_collections(client):
    response = client.get("/api/v1/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["experiments"].endswith("/api/v1/experiments/")
    assert body["runs"].endswith("/api/v1/runs/") and body["swagger"].endswith(
        "/api/schema/swagger/"
    )
    assert client.get("/api/v1/experiments/").status_code == 401, (
        "the collections still ask for credentials"
    )


def test_swagger_page_has_no_inline_style_or_script(client):
    html = client.get("/api/schema/swagger/").content.decode()
    assert "<style" not in html and "<script>" not in html, html


def test_favicon(client):
    response = client.get("/favicon.ico")
    assert (
        response.status_code == 302
        and response["Location"].endswith(".svg")
        and "favicon" in response["Location"]
    )
    page = client.get(reverse("dashboard:login")).content.decode()
    assert 'rel="icon"' in page


def test_local_settings_show_the_sites_own_404(monkeypatch):
    """`make run` (config.settings.local) runs without DEBUG unless DJANGO_DEBUG=true asks for
    it."""
    import importlib

    monkeypatch.delenv("DJANGO_DEBUG", raising=False)
    import config.settings.local as local

    assert importlib.reload(local).DEBUG is False
    monkeypatch.setenv("DJANGO_DEBUG", "true")
    assert importlib.reload(local).DEBUG is True
    monkeypatch.delenv("DJANGO_DEBUG")
    importlib.reload(local)


def test_404_is_the_sites_page(member):
    response = member.get("/no-such-page/")
    assert response.status_code == 404
    assert b"There is nothing here" in response.content and b"URLconf" not in response.content


def test_admin_labels_are_written_for_people(client):
    staff = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(staff)
    form = client.get(reverse("admin:pricing_pricingtable_add")).content.decode()
    for label in (
        "PUE",
        "Price per vCPU-hour (USD)",
        "Price per GB-hour of memory (USD)",
        "Electricity (USD per kWh)",
    ):
        assert f">{label}:<" in form, label
    assert ">Pue:<" not in form and "Vcpu hour usd" not in form
    experiment_form = client.get(reverse("admin:experiments_experiment_add")).content.decode()
    assert "design document" not in experiment_form
    assert PricingTable._meta.get_field("pue").verbose_name == "PUE"


def test_admin_has_one_token_section():
    labels = {m._meta.app_label + "." + m._meta.model_name for m in admin.site._registry}
    assert "api.apitoken" in labels and "knox.authtoken" not in labels


def test_plotly_stylesheet_matches_the_installed_bundle():
    """plotly.css holds the rules plotly.js would insert inline; after a plotly upgrade: `manage.py
    plotly_css`."""
    assert STYLESHEET.read_text(encoding="utf-8") == plotly_css(), "run `manage.py plotly_css`"
    assert ".js-plotly-plot .plotly .modebar{" in STYLESHEET.read_text(encoding="utf-8")


def test_admin_login_lockout_names_the_limit(client):
    """10 wrong passwords on /admin/login/, then the right one is refused with a clear message
    (429)."""
    staff = UserFactory(username="ops", is_staff=True)
    staff.set_password("right-password-1")
    staff.save()
    url = reverse("admin:login")
    for _ in range(10):
        client.post(url, {"username": "ops", "password": "wrong"}, REMOTE_ADDR="10.0.0.1")
    refused = client.post(
        url, {"username": "ops", "password": "right-password-1"}, REMOTE_ADDR="10.0.0.1"
    )
    assert refused.status_code == 429
    assert b"Too many failed sign-ins" in refused.content and b"15 min" in refused.content
    assert "_auth_user_id" not in client.session
    # Another address is not locked out: the lockout is per username and address.
    ok = client.post(
        url, {"username": "ops", "password": "right-password-1"}, REMOTE_ADDR="10.0.0.2"
    )
    assert ok.status_code == 302 and "_auth_user_id" in client.session
