"""The sweep page: the scatter's data, the table with the frontier marked, infeasible probes with
their reason, the live poll, and another tenant's sweep answering 404."""

import json
import re

import pytest
from django.urls import reverse

from apps.sweeps import services
from tests.factories import TenantFactory
from workers.sweeps import probe_execute

pytestmark = pytest.mark.django_db

BASE = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 9, global_batch: 2}\n"
)


def landed_sweep(tenant):
    sweep = services.sweep_create(
        tenant=tenant,
        name="cheaper",
        base_strategy_yaml=BASE,
        probe_count=3,
        probe_steps=3,
        parallelism=1,
        space={"train.global_batch": [1, 2], "train.micro_batch": [2], "model.seq_len": [16]},
    )
    while sweep.probes.filter(status="queued").exists():
        probe_execute(sweep.probes.get(status="queued").pk)
    return sweep


@pytest.mark.slow
def test_the_sweep_page_draws_probes_marks_the_frontier_and_the_infeasible(member, w):
    sweep = landed_sweep(w.experiment.tenant)
    page = member.get(reverse("dashboard:sweep", args=[sweep.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    chart = json.loads(
        re.search(r'<script id="sweep-data" type="application/json">(.*?)</script>', html, re.S)[1]
    )
    assert [a["key"] for a in chart["axes"]] == ["usd_per_mtok", "peak_mem_mb"] and chart[
        "poll_ms"
    ] is None
    (bad,) = (p for p in chart["probes"] if "train.global_batch=1," in p["strategy"] + ",")
    (good,) = (p for p in chart["probes"] if "train.global_batch=2," in p["strategy"] + ",")
    assert bad["status"] == "infeasible" and bad["x"] is None and "micro_batch" in bad["reason"]
    assert good["on_frontier"] and good["x"] > 0
    table = html[html.index('id="probes"') :]
    assert (
        table.count("✓") == 1
        and "Infeasible" in table
        and "USD per 1M tok" in table
        and "est." in table
    )
    live = member.get(reverse("dashboard:sweep-live", args=[sweep.pk])).json()
    assert live["probes"] == chart["probes"]
    assert sweep.name in member.get(reverse("dashboard:sweeps")).content.decode()


def test_another_tenants_sweep_is_not_found(member, w):
    sweep = services.sweep_create(
        tenant=TenantFactory(),
        name="theirs",
        base_strategy_yaml=BASE,
        probe_count=1,
        probe_steps=3,
        space={"model.seq_len": [16]},
    )
    assert member.get(reverse("dashboard:sweep", args=[sweep.pk])).status_code == 404
    assert member.get(reverse("dashboard:sweep-live", args=[sweep.pk])).status_code == 404
    assert "theirs" not in member.get(reverse("dashboard:sweeps")).content.decode()
