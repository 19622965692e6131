"""Unpriced GPU time is a state, never a saving: an arm (or a control) whose runs hold GPU time
billed with no price reads `unpriced` in the report, naming the SKU (issue 45's audit: an H100
candidate with unpriced GPU time read -93.8 % and passed the gate)."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.attribution.services import attribution_tick
from apps.pricing.models import GpuSku
from tests.apps.api.test_quality import run_trained
from tests.factories import GpuPriceFactory, PricingTableFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("unpriced_arm", ["candidate", "control"])
def test_an_arm_with_unpriced_gpu_time_is_never_compared(api, session, experiment, unpriced_arm):
    table = PricingTableFactory(
        tenant=experiment.tenant, valid_from=timezone.now() - timedelta(days=30)
    )
    priced = GpuPriceFactory(pricing_table=table).sku
    bare = GpuSku.objects.create(
        name="NVIDIA H100 SXM 80GB (test)", memory_gb=80, tdp_w=700, peak_bf16_tflops=989
    )
    api.patch(
        f"/api/v1/experiments/{experiment.pk}/",
        {"min_runs_per_arm": 2, "min_cs_runs_per_arm": 2, "min_samples_per_arm": 10},
        format="json",
    )
    start = timezone.now() - timedelta(hours=2)
    for i in range(3):
        for arm in experiment.arms.all():
            sku = bare if arm.name == unpriced_arm else priced
            run_trained(
                api,
                experiment,
                arm,
                start=start + timedelta(minutes=10 * i),
                tokens_per_s=1000,
                eval_loss=3.0,
                gpu_sku=sku.name,
            )
    attribution_tick(now=timezone.now())
    report = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    candidate = next(a for a in report["arms"] if a["name"] == "candidate")
    holder = next(a for a in report["arms"] if a["name"] == unpriced_arm)
    assert candidate["verdict"] == "unpriced", candidate
    assert holder["unpriced"].get("gpu", 0) > 0 and holder["unpriced_skus"] == [bare.name]
    # ... and every place a user or a pipeline reads the comparison says so
    rows = list(csv.DictReader(io.StringIO(session_text(session, "comparison.csv", experiment))))
    marked = next(r for r in rows if r["name"] == unpriced_arm)
    assert json.loads(marked["unpriced_s"])["gpu"] > 0
    page = session_text(session, "comparison/", experiment)
    assert 'data-col="unpriced"' in page and "unpriced gpu" in page
    runs_csv = session.get("/runs.csv")
    runs = list(csv.DictReader(io.StringIO(b"".join(runs_csv.streaming_content).decode())))
    assert any(r["unpriced_s"] and "gpu" in json.loads(r["unpriced_s"]) for r in runs)


def session_text(client, tail: str, experiment) -> str:
    response = client.get(f"/experiments/{experiment.pk}/{tail}")
    assert response.status_code == 200, response.status_code
    body = response.streaming_content if response.streaming else [response.content]
    return b"".join(body).decode()
