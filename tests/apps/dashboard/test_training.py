"""The run page's training metrics (one small chart per metric, at most eight, drawn from the page's
data) and its hyperparameters table (flattened keys, escaped: a value is the team's data), compared
with another of the user's runs on ?against=."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.telemetry.models import RunMetric
from tests.apps.dashboard.test_pages import text
from tests.apps.dashboard.world import run_of
from tests.factories import ArmFactory, ExperimentFactory

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"


def page_data(response) -> dict:
    found = re.search(r'<script id="dashboard-data"[^>]*>(.*?)</script>', response.content.decode())
    return json.loads(found.group(1))


def test_the_run_page_charts_training_metrics_and_lists_hyperparameters(member, w):
    hyper = {"learning_rate": 3e-4, "optim": {"name": XSS}, "seed": 1}
    run = run_of(w.candidate, params={"hyperparameters": hyper, "model": {"hidden_size": 64}})
    now = timezone.now()
    names = ["zeta", "loss", "grad_norm", *(f"m{i}" for i in range(7))]  # ten: two uncharted
    RunMetric.objects.bulk_create(
        RunMetric(run=run, seq=step, ts=now, step=step, name=name, value=1.0 / (step + 1))
        for name in names
        for step in range(3)
    )
    response = member.get(reverse("dashboard:run", args=[run.pk]))
    page, html = text(response), response.content.decode()
    charts = re.findall(r'data-kind="metric" data-metric="([^"]+)"', html)
    assert charts[:2] == ["loss", "grad_norm"] and len(charts) == 8  # health first, then by name
    assert "2 more not charted" in page and "zeta" in page
    metrics = page_data(response)["metrics"]
    assert metrics["series"]["loss"]["step"] == [0, 1, 2] and metrics["names"] == charts
    for shown in ("learning_rate", "0.0003", "optim.name", "model.hidden_size", "seed"):
        assert shown in page, shown
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html

    other = run_of(w.control, params={"hyperparameters": {**hyper, "seed": 2, "warmup": 10}})
    compared = member.get(reverse("dashboard:run", args=[run.pk]), {"against": other.pk})
    table = text(compared)[text(compared).index("Hyperparameters") :]
    assert f"Against run {other.pk} : 3 keys differ, 2 agree." in table  # learning_rate, optim.name
    assert "seed 1 2" in table and "warmup (not set) 10" in table
    assert "model.hidden_size 64 (not set)" in table and "learning_rate" not in table

    theirs = run_of(ArmFactory(experiment=ExperimentFactory()), params={"hyperparameters": hyper})
    refused = text(member.get(reverse("dashboard:run", args=[run.pk]), {"against": theirs.pk}))
    assert f"No run {theirs.pk} among your runs" in refused and "Against run" not in refused
