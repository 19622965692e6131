"""FOCUS over the API and the commands: an invoice's export in (staff), costlab's allocation out
(members and tokens)."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.pricing.models import PricingTable
from tests.apps.api.conftest import error
from tests.apps.pricing.focus_files import aws, to_csv
from tests.apps.pricing.test_focus_import import aws_month

pytestmark = pytest.mark.django_db


def upload(data: bytes, name: str = "aws-2026-05.csv") -> io.BytesIO:
    file = io.BytesIO(data)
    file.name = name
    return file


def test_the_command_and_the_api_import_and_answer_the_same_file_once(staff, api, tenant, tmp_path):
    data = to_csv(aws_month())
    url = "/api/v1/pricing-tables/import-focus/"
    refused = api.post(url, {"file": upload(data)}, format="multipart")
    assert refused.status_code == 403  # an API token reads prices; staff write them
    created = staff.post(url, {"file": upload(data)}, format="multipart")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["pricing_table"]["name"].startswith("from invoice INV-AWS-2026-05")
    assert body["import"]["filename"] == "aws-2026-05.csv" and body["import"]["rows"] == 17
    path = tmp_path / "aws-2026-05.csv"
    path.write_bytes(data)
    out = io.StringIO()
    call_command("prices_import_focus", str(path), "--tenant", "acme", stdout=out)
    said = out.getvalue()
    assert said.startswith(f"already imported: pricing table {body['pricing_table']['id']}")
    assert "skipped 1 rows: tax (ChargeCategory Tax): rows 6" in said
    assert re.search(
        r"derived p5\.48xlarge: .*/h \((list [\d.]+/h|no list price)\), .* per GPU-hour;"
        r" from instance-hours",
        said,
    ), said
    assert PricingTable.objects.filter(tenant=tenant).count() == 1
    refused = staff.post(url, {"file": upload(b"a,b\n1,2\n", "x.csv")}, format="multipart")
    assert refused.status_code == 400
    assert "mandatory columns missing: BilledCost" in error(refused)["message"]
    again = staff.post(url, {"file": upload(data)}, format="multipart")
    assert again.status_code == 200 and again.json()["import"]["already_imported"]
    eur = staff.post(
        url,
        {"file": upload(to_csv([aws("p5.48xlarge", hours=1, effective="50")])), "currency": "eur"},
        format="multipart",
    )
    assert eur.status_code == 400 and "currency" in error(eur)["fields"]


def test_the_allocation_of_a_month_as_focus_csv(api, other_api, tenant, tmp_path):
    from apps.billing.services import telemetry_ingest
    from tests.factories import ArmFactory, ExperimentFactory, RunFactory

    arm = ArmFactory(experiment=ExperimentFactory(tenant=tenant, name="exp"), name="control")
    start = timezone.now() - timedelta(hours=1)
    run = RunFactory(arm=arm, kind="external", status="running", vcpus=4, created=start)
    telemetry_ingest(
        run_id=run.pk,
        samples=[{"seq": i, "ts": start.timestamp() + 60 * i} for i in range(3)],
    )
    run.refresh_from_db()
    period = f"{run.samples_from:%Y-%m}"
    response = api.get(f"/api/v1/focus/?period={period}")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert f"costlab-focus-acme-{period}.csv" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert sum(r["x_CostlabRunId"] == str(run.pk) for r in rows) >= 1
    mine = b"".join(other_api.get(f"/api/v1/focus/?period={period}").streaming_content)
    assert mine.decode().count("\n") == 1  # the other tenant's month: its header alone
    bad = api.get("/api/v1/focus/?period=2026-5")
    assert bad.status_code == 400 and "period" in error(bad)["fields"]
    out = tmp_path / "focus.csv"
    call_command("focus_export", "--tenant", "acme", "--period", period, "--output", str(out))
    assert out.read_text().splitlines()[0].startswith("BilledCost,BillingAccountId")
