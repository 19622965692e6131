"""What the pages draw matches what was measured: throughput per step, memory when it is sent, the
resources a run recorded, and one colour per arm on every page."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.billing.services import telemetry_ingest
from apps.dashboard import charts
from apps.dashboard.runs import spend_overview
from apps.experiments.models import Run
from tests.apps.dashboard.world import run_of, samples, train
from tests.factories import ArmFactory, ExperimentFactory

pytestmark = pytest.mark.django_db

# A slow step (36 s) sampled every second, as the runtime sends it: tokens and step move only when
# a step ends; `tokens_per_s` is the tokens of that second (2,000 at a step's end, 0 otherwise).
STEP_S, TOKENS_PER_STEP = 36, 2000


def chart_data(response) -> dict:
    found = re.search(
        r'<script id="dashboard-data" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    return json.loads(found.group(1))


def ingest(run: Run, rows: list[dict]) -> Run:
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    telemetry_ingest(run_id=run.pk, samples=rows, attempt=run.attempts)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    run.refresh_from_db()
    return run


def slow_steps(*, n: int, **overrides) -> list[dict]:
    rows = samples(start=timezone.now() - timedelta(seconds=n + 5), first_seq=0, n=n, **overrides)
    for i, row in enumerate(rows):
        step = (i + 1) // STEP_S
        ended = (i + 1) % STEP_S == 0
        row.update(
            step=step,
            tokens=step * TOKENS_PER_STEP,
            step_time_s=float(STEP_S) if ended else None,
            tokens_per_s=float(TOKENS_PER_STEP) if ended else 0.0,
        )
    return rows


def test_throughput_is_tokens_over_step_time_one_point_per_step(member, w):
    run = ingest(run_of(w.control), slow_steps(n=STEP_S * 5))
    data = chart_data(member.get(reverse("dashboard:run", args=[run.pk])))
    band = data["telemetry"]["series"]["tokens_per_s"][str(run.pk)]
    rate = TOKENS_PER_STEP / STEP_S  # 55.6 tokens/s, what the run really trained at
    assert len(band["y"]) == 5, "one point per step, none between step ends"
    assert band["y"] == pytest.approx([rate] * 5, rel=1e-3)
    assert max(band["hi"]) == pytest.approx(rate, rel=1e-3)


def test_live_throughput_is_per_step_too(w):
    from apps.dashboard.series import live_series

    run = ingest(run_of(w.control), slow_steps(n=STEP_S * 3))
    since = timezone.now() - timedelta(seconds=STEP_S * 3 + 10)
    band = live_series(runs=[run], fields=charts.RUN_FIELDS, since=since).series[run.pk][
        "tokens_per_s"
    ]
    assert band.y == pytest.approx([TOKENS_PER_STEP / STEP_S] * 3, rel=1e-3)


def test_loss_is_charted_on_the_experiment_page_against_time_steps_or_tokens(member, w):
    run = train(run_of(w.control), n=20)
    response = member.get(reverse("dashboard:experiment", args=[w.experiment.pk]))
    data = chart_data(response)["telemetry"]
    assert data["series"]["loss"][str(run.pk)]["y"][0] == 3.0
    progress = data["progress"][str(run.pk)]
    assert progress["step"]["y"] == [float(s) for s in range(1, 21)]
    assert progress["tokens"]["y"][-1] == 1024.0 * 20
    assert progress["step"]["x"] == data["series"]["loss"][str(run.pk)]["x"]
    assert 'data-xaxis="step"' in response.content.decode()


def test_a_memory_chart_appears_when_memory_is_sent(member, w):
    quiet = train(run_of(w.control), n=20)
    data = chart_data(member.get(reverse("dashboard:run", args=[quiet.pk])))
    assert "mem_used_mb" not in data["telemetry"]["fields"], "no memory sent: no memory chart"

    sent = train(run_of(w.control), n=20, mem_used_mb=1536.0)
    response = member.get(reverse("dashboard:run", args=[sent.pk]))
    data = chart_data(response)
    assert data["telemetry"]["fields"]["mem_used_mb"]["unit"] == "MB"
    assert data["telemetry"]["series"]["mem_used_mb"][str(sent.pk)]["y"] == [1536.0] * 20
    assert 'id="chart-mem_used_mb"' in response.content.decode()


def test_resources_say_what_was_recorded(member, w):
    run = train(run_of(w.control, vcpus=1, memory_gb=0.0), n=10, mem_used_mb=2048.0)
    page = member.get(reverse("dashboard:run", args=[run.pk])).content.decode()
    resources = re.search(r"<th>Resources</th><td>(.*?)</td>", page, re.S).group(1)
    assert "0 GB" not in resources, resources
    assert "1 vCPU" in resources and "not recorded" in resources, resources
    assert "peak 2,048 MB used" in resources, resources


def test_an_arm_has_one_colour_on_every_page(member, w):
    """The control first, then by name: here the control's name sorts last, as the demo's does."""
    experiment = ExperimentFactory(tenant=w.experiment.tenant, status="active")
    control = ArmFactory(experiment=experiment, name="pytorch-baseline", is_control=True)
    candidate = ArmFactory(experiment=experiment, name="costlab-optimized")
    runs = {arm.pk: train(run_of(arm), n=10) for arm in (control, candidate)}

    # The experiment page's order (apps.dashboard.selectors.experiment_parts).
    colour = {control.pk: charts.ARM_COLORS[0], candidate.pk: charts.ARM_COLORS[1]}
    assert charts.arm_color_indices(experiment_ids=[experiment.pk]) == {
        control.pk: 0,
        candidate.pk: 1,
    }

    spend = spend_overview(user=w.user)["chart"][str(experiment.tenant_id)]["traces"]
    spent = {t["name"].split(" / ")[1]: t["color"] for t in spend if experiment.name in t["name"]}
    assert spent == {control.name: colour[control.pk], candidate.name: colour[candidate.pk]}

    for arm_id, run in runs.items():
        drawn = chart_data(member.get(reverse("dashboard:run", args=[run.pk])))["arms"]
        assert drawn[str(arm_id)]["color"] == colour[arm_id], "the run page draws its arm's colour"
