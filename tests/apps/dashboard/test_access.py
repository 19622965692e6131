"""Who sees what: sign-in required, a page of its own to sign in, and every read scoped to the
user's teams (another team's experiment is a 404, as if it did not exist)."""

import pytest
from django.urls import reverse

from apps.experiments.models import Run
from tests.apps.dashboard.world import PASSWORD, run_of, train, world

pytestmark = pytest.mark.django_db


def pages(w, run):
    return [
        reverse("dashboard:experiments"),
        reverse("dashboard:pricing"),
        reverse("dashboard:experiment", args=[w.experiment.pk]),
        reverse("dashboard:experiment-comparison", args=[w.experiment.pk]),
        reverse("dashboard:run", args=[run.pk]),
    ]


def test_anonymous_visitors_are_sent_to_the_dashboard_login(client, w):
    run = run_of(w.control)
    for url in pages(w, run):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("dashboard:login") + "?next="), url


def test_polling_endpoints_answer_json_401_when_signed_out(client, w):
    run = run_of(w.control, status=Run.Status.RUNNING)
    for url in (
        reverse("dashboard:experiment-live", args=[w.experiment.pk]),
        reverse("dashboard:run-live", args=[run.pk]),
    ):
        response = client.get(url, {"since": 0})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "not_authenticated"


def test_sign_in_with_the_login_page_then_sign_out(client, w):
    page = client.get(reverse("dashboard:login"))
    assert page.status_code == 200 and b'name="password"' in page.content
    wrong = client.post(
        reverse("dashboard:login"), {"username": w.user.username, "password": "nope"}
    )
    assert wrong.status_code == 200 and b"did not match" in wrong.content
    ok = client.post(
        reverse("dashboard:login"), {"username": w.user.username, "password": PASSWORD}
    )
    assert ok.status_code == 302 and ok["Location"] == reverse("dashboard:experiments")
    assert client.get(reverse("dashboard:experiments")).status_code == 200
    out = client.post(reverse("dashboard:logout"))
    assert out.status_code == 302 and out["Location"] == reverse("dashboard:login")
    assert client.get(reverse("dashboard:experiments")).status_code == 302


def test_another_teams_experiment_and_runs_are_404(member, w):
    other = world()
    run = run_of(other.control, status=Run.Status.RUNNING)
    for url in pages(other, run)[2:]:
        assert member.get(url).status_code == 404, url
    for url in (
        reverse("dashboard:experiment-live", args=[other.experiment.pk]),
        reverse("dashboard:run-live", args=[run.pk]),
    ):
        response = member.get(url, {"since": 0})
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_lists_show_only_the_users_teams(member, w):
    other = world()
    train(run_of(other.control), n=10)
    listing = member.get(reverse("dashboard:experiments")).content.decode()
    assert w.experiment.name in listing and other.experiment.name not in listing
    pricing = member.get(reverse("dashboard:pricing")).content.decode()
    assert f'data-tenant="{w.experiment.tenant.slug}"' in pricing
    assert f'data-tenant="{other.experiment.tenant.slug}"' not in pricing


def test_staff_see_the_admin_link_members_do_not(client, w):
    admin_link = f'href="{reverse("admin:index")}"'
    client.force_login(w.user)
    assert admin_link not in client.get(reverse("dashboard:experiments")).content.decode()
    staff = world(staff=True)
    client.force_login(staff.user)
    assert admin_link in client.get(reverse("dashboard:experiments")).content.decode()


def test_healthz_admin_and_api_are_still_mounted(client, db):
    assert client.get("/healthz").status_code in (200, 503)
    assert client.get("/admin/login/").status_code == 200
    assert client.get("/api/v1/nothing-here/").json()["error"]["code"]
