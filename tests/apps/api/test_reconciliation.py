"""Reconciliation over the API (GET /api/v1/reconciliation/?period=YYYY-MM, JSON or CSV), and the
cloud resource a run records (`resource_id` at submit, in the run's answer)."""

from __future__ import annotations

import csv
import io

import pytest

from apps.experiments.resources import RESOURCE_ID_MAX
from tests.apps.api.conftest import error
from tests.apps.billing.reconcile_world import ARN, invoiced_month

pytestmark = pytest.mark.django_db
URL = "/api/v1/reconciliation/"


@pytest.fixture
def month(tenant):
    return invoiced_month(tenant)


def test_the_month_reconciled_as_json_and_as_csv(api, month):
    answer = api.get(URL, {"period": "2026-05"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["period"] == "2026-05" and body["currency"] == "USD"
    assert body["focus_import"]["id"] == month.outcome.record.pk
    assert body["focus_import"]["filename"] == "aws-2026-05.csv"
    totals = body["totals"]
    assert totals["invoice_usd"] == "1766.803200" and totals["idle_usd"] == "1490.400000"
    assert totals["difference_usd"] == "0.000000" and totals["unmatched_usd"] == "58.650000"
    assert [(i["resource_id"], i["usd"]) for i in body["idle_by_resource"]] == [
        ("i-0idle", "1324.800000"),
        ("i-0bbb", "110.400000"),
        (f"{ARN}i-0aaa", "55.200000"),
    ]
    assert {(u["resource_id"], u["status"]) for u in body["unmatched_by_resource"]} == {
        ("i-0ddd", "unmatched"),
        ("", "no resource recorded"),
    }
    assert body["biggest_differences"] == []  # the runs were priced as the invoice prices

    csv_answer = api.get(URL, {"period": "2026-05", "format": "csv"})
    assert csv_answer.status_code == 200
    assert csv_answer["Content-Type"].startswith("text/csv")
    assert 'filename="costlab-reconciliation-acme-2026-05.csv"' in csv_answer["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(csv_answer.streaming_content).decode())))
    assert len(rows) == 8
    idle = next(r for r in rows if r["resource_id"] == "i-0idle")
    assert (idle["status"], idle["idle_usd"], idle["billed_hours"]) == (
        "idle",
        "1324.800000",
        "192.000000",
    )


def test_bad_periods_and_imports_are_refused_naming_the_field(api, other_api, month):
    missing = api.get(URL)
    assert missing.status_code == 400 and error(missing)["message"].startswith("period:")
    for bad in ("2026-13", "May 2026", "2026-5"):
        answer = api.get(URL, {"period": bad})
        assert answer.status_code == 400, bad
        assert (
            error(answer)["message"].startswith("period:") and "period" in error(answer)["fields"]
        )
    none = api.get(URL, {"period": "2026-04"})
    assert none.status_code == 404
    assert error(none)["code"] == "no_invoice"
    assert error(none)["fields"] == {"period": ["no invoice imported for 2026-04"]}
    assert error(none)["message"].startswith("period: no FOCUS import of team 'acme' bills")
    # another team sees no import of this one, and cannot name it
    assert other_api.get(URL, {"period": "2026-05"}).status_code == 404
    foreign = other_api.get(URL, {"period": "2026-05", "focus_import": month.outcome.record.pk})
    assert foreign.status_code == 404 and "focus_import" in error(foreign)["fields"]
    bad_id = api.get(URL, {"period": "2026-05", "focus_import": "latest"})
    assert bad_id.status_code == 400 and error(bad_id)["message"].startswith("focus_import:")


def test_an_external_run_sends_its_cloud_resource_and_the_answer_shows_it(api, experiment):
    body = {"experiment": experiment.pk, "kind": "external", "resource_id": f"{ARN}i-0abc"}
    created = api.post("/api/v1/runs/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["resource_id"] == f"{ARN}i-0abc"
    run = api.get(f"/api/v1/runs/{created.json()['id']}/").json()
    assert run["resource_id"] == f"{ARN}i-0abc"
    for value, reason in (
        ("i-0abc def", "character ' ' at position 7 is not allowed"),
        ("i-0abc;rm", "character ';' at position 7 is not allowed"),
        ("x" * (RESOURCE_ID_MAX + 1), f"at most {RESOURCE_ID_MAX} characters"),
    ):
        refused = api.post(
            "/api/v1/runs/",
            {**body, "resource_id": value, "run_key": f"bad-{len(value)}"},
            format="json",
        )
        assert refused.status_code == 400, value
        assert error(refused)["message"].startswith(f"resource_id: {reason}"), error(refused)
    worker = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "resource_id": "i-0abc"}, format="json"
    )
    assert worker.status_code == 400
    assert error(worker)["message"] == (
        "resource_id: only an external run declares it; a worker records what it holds"
    )
    plain = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "kind": "external"}, format="json"
    )
    assert plain.json()["resource_id"] == ""
