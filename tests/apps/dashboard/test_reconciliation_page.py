"""The reconciliation page: a month of the team's bill against the cloud's invoice (totals, the
biggest differences, idle and unmatched by resource), its period picker and its CSV; and the run
page's cloud resource."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from tests.apps.billing.reconcile_world import ARN, invoiced_month
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def month():
    return invoiced_month()


@pytest.fixture
def lab(client, month):
    user = UserFactory(username="rita")
    MembershipFactory(user=user, tenant=month.tenant)
    client.force_login(user)
    return client


def test_the_page_shows_totals_differences_idle_and_unmatched_by_resource(lab, month):
    response = lab.get(reverse("dashboard:reconciliation"))  # the latest month with an invoice
    assert response.status_code == 200
    assert response.context["period"] == "2026-05"
    page = response.content.decode()
    assert 'id="reconciliation-month">May 2026<' in page
    assert "aws-2026-05.csv" in page and "INV-AWS-2026-05" in page
    assert "1,766.80 USD" in page  # the invoice
    assert "1,490.40 USD" in page  # idle
    assert "58.65 USD" in page  # unmatched
    assert "<code>i-0idle</code>" in page and "1,324.80 USD" in page
    assert f"<code>{ARN}i-0aaa</code>" in page
    assert "<code>i-0ddd</code>" in page and "no invoice row" in page
    assert "none recorded" in page
    assert "No difference" in page
    csv_link = f"{reverse('dashboard:reconciliation-csv')}?tenant=lab&amp;period=2026-05"
    assert csv_link in page


def test_a_month_with_no_invoice_says_so_and_a_bad_month_is_named(lab, month):
    april = lab.get(reverse("dashboard:reconciliation"), {"period": "2026-04"})
    assert april.status_code == 200
    assert "period: no FOCUS import of team &#x27;lab&#x27; bills" in april.content.decode()
    bad = lab.get(reverse("dashboard:reconciliation"), {"period": "May"})
    assert bad.status_code == 400
    assert bad.context["error"] == "period: 'May' is not a month written YYYY-MM, e.g. 2026-05"


def test_the_csv_is_the_teams_own(lab, client, month):
    url = reverse("dashboard:reconciliation-csv")
    answer = lab.get(url, {"tenant": "lab", "period": "2026-05"})
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert {r["resource_id"] for r in rows} >= {"i-0idle", "i-0ddd", f"{ARN}i-0aaa"}
    assert lab.get(url, {"tenant": "lab", "period": "2026-13"}).status_code == 400
    assert lab.get(url, {"tenant": "lab", "period": "2026-04"}).status_code == 404
    TenantFactory(slug="elsewhere")
    assert lab.get(url, {"tenant": "elsewhere", "period": "2026-05"}).status_code == 404
    stranger = UserFactory(username="stan")
    client.force_login(stranger)
    page = client.get(reverse("dashboard:reconciliation"), {"period": "2026-05"})
    assert "i-0idle" not in page.content.decode()


def test_the_run_page_shows_its_cloud_resource(lab, month):
    page = lab.get(reverse("dashboard:run", args=[month.runs["aaa"].pk])).content.decode()
    assert 'id="run-resource"' in page and "<code>i-0aaa</code>" in page
    page = lab.get(reverse("dashboard:run", args=[month.runs["none"].pk])).content.decode()
    assert "not recorded (set <code>COSTLAB_RESOURCE_ID</code>" in page


def test_the_page_needs_a_signed_in_user(client):
    for name in ("dashboard:reconciliation", "dashboard:reconciliation-csv"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and "/login/" in response["Location"]
