"""The sweep page: the scatter's data, the table with the frontier marked, infeasible probes with
their reason, the live poll, and another tenant's sweep answering 404."""

import json
import re

import pytest
from django.urls import reverse
from django.utils.html import escape

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


@pytest.mark.slow
def test_promote_and_cancel_from_the_sweep_page(member, w):
    """Issue 25: the sweep page had no Promote and no Cancel, numbered probes #0-3 where the API
    wants ids 1-4, and a promoted draft experiment had no link from its sweep."""
    from apps.experiments.models import Arm
    from apps.sweeps.models import Probe

    sweep = landed_sweep(w.experiment.tenant)
    url = reverse("dashboard:sweep", args=[sweep.pk])
    html = member.get(url).content.decode()
    good = Probe.objects.get(sweep=sweep, status="succeeded")
    bad = Probe.objects.get(sweep=sweep, status="infeasible")
    # Probes carry the API's id (their place in the sweep beside it).
    assert f'data-probe="{good.pk}"><td>{good.pk} <span class="muted small">#{good.number}' in html
    assert 'id="sweep-cancel"' not in html  # the sweep has ended: nothing to cancel
    promote = reverse("dashboard:sweep-promote", args=[sweep.pk])
    refused = member.post(promote, {"probe": bad.pk, "experiment_name": "x"}, follow=True)
    said = f"probe {bad.pk} (#{bad.number} of the sweep) is not on the sweep's frontier"
    assert escape(said) in refused.content.decode()
    done = member.post(promote, {"probe": good.pk, "experiment_name": "from the sweep"})
    arm = Arm.objects.get(experiment__name="from the sweep", is_control=False)
    assert done.status_code == 302 and done.url == reverse(
        "dashboard:experiment", args=[arm.experiment_id]
    )
    assert arm.strategy_yaml == good.strategy_yaml and arm.experiment.status == "draft"
    html = member.get(url).content.decode()
    link = reverse("dashboard:experiment", args=[arm.experiment_id])
    assert f'href="{link}" class="promoted"' in html and "(draft)" in html
    # Into an existing experiment of the team, with a weight.
    member.post(promote, {"probe": good.pk, "experiment": w.experiment.pk, "weight": "0.5"})
    assert w.experiment.arms.get(strategy_yaml=good.strategy_yaml).weight == 0.5
    bad_weight = member.post(
        promote, {"probe": good.pk, "experiment": w.experiment.pk, "weight": "x"}, follow=True
    )
    assert "weight:" in bad_weight.content.decode()


def test_a_running_sweep_is_cancelled_from_its_page(member, w):
    sweep = services.sweep_create(
        tenant=w.experiment.tenant,
        name="long",
        base_strategy_yaml=BASE,
        probe_count=2,
        probe_steps=3,
        space={"model.seq_len": [16, 32]},
    )
    url = reverse("dashboard:sweep", args=[sweep.pk])
    assert 'id="sweep-cancel"' in member.get(url).content.decode()
    page = member.post(reverse("dashboard:sweep-cancel", args=[sweep.pk]), follow=True)
    assert "Sweep &#x27;long&#x27; cancelled." in page.content.decode()
    sweep.refresh_from_db()
    assert sweep.status == "cancelled"
    assert not sweep.probes.filter(status="queued").exists()
