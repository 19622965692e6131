"""Quality beside cost on the experiment page: the verdict card says it in words (a cheaper arm
with a worse model, quality not measured), the comparison and its CSV carry the quality columns and
the cost to the control's quality, and the chart draws held-out loss against cumulative USD per
run."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import replace
from datetime import timedelta
from html import unescape

import pytest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from apps.billing.services import telemetry_ingest
from apps.dashboard import charts
from apps.dashboard.verdicts import Freeze, arms_said, experiment_verdicts
from apps.experiments.models import Run
from tests.apps.attribution.lab import Lab
from tests.apps.attribution.test_quality import finish
from tests.apps.dashboard.test_verdicts import ARM, CONTROL
from tests.apps.dashboard.world import run_of, samples
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def quality(verdict, change=None, low=None, high=None, note=""):
    """A quality verdict as the report and the snapshots carry it
    (apps.attribution.decide.quality)."""
    return {
        "verdict": verdict,
        "metric": "eval_loss",
        "direction": "lower",
        "margin": 0.01,
        "value": None if change is None else 3.0 * (1 + change),
        "control_value": 3.0,
        "change": change,
        "change_low": low,
        "change_high": high,
        "runs": 10,
        "control_runs": 12,
        "note": note,
        "alpha": 0.05,
    }


def said(w, freezes=None, **changes):
    arm = replace(ARM, **changes)
    (verdict,) = arms_said(experiment=w.experiment, arms=[CONTROL, arm], freezes=freezes)
    return verdict


def card_text(w, verdict) -> str:
    """The verdict line as the card renders it, tags stripped, spaces folded."""
    html = render_to_string(
        "dashboard/_verdict.html",
        {"experiment": w.experiment, "verdicts": [verdict], "arm_colors": {}, "arm_report": {}},
    )
    return " ".join(unescape(strip_tags(html.replace("<br>", " "))).split())


def test_a_cheaper_arm_with_a_worse_model_says_both_and_that_it_gets_no_traffic(w):
    at = timezone.now()
    v = said(
        w,
        state="frozen",
        deviation=-0.18,
        deviation_low=-0.24,
        deviation_high=-0.12,
        quality=quality("worse", 0.049, 0.041, 0.057),
        freezes={2: Freeze(at, "quality: held-out loss +4.90% worse than control", -0.18)},
    )
    assert v.verdict == "cheaper_but_worse" and v.amount == "18 % cheaper"
    assert v.bound == "95 % sure it is 12–24 % cheaper", "one side of zero: sizes and the word"
    assert (v.quality.amount, v.quality_joint) == ("4.9 % worse", "but")
    when = f"{timezone.localtime(at):%H:%M}"
    assert v.status == f"cheaper but worse, frozen at {when} (it gets no traffic)"
    assert v.detail.startswith("quality: held-out loss") and not v.not_frozen
    text = card_text(w, v)
    assert (
        "bf16-dynamic is 18 % cheaper per 1M tokens than fp32-control "
        "(95 % sure it is 12–24 % cheaper), but its held-out loss is 4.9 % worse "
        "(95 % sure it is 4.1–5.7 % worse, beyond the 1 % margin): cheaper but worse, frozen at"
    ) in text, text
    assert "it gets no traffic" in text and "Held-out" not in text, "said once, in the sentence"


def test_a_worse_model_at_a_higher_cost_reads_worse(w):
    v = said(
        w,
        deviation=0.03,
        deviation_low=-0.01,
        deviation_high=0.07,
        quality=quality("worse", 0.06, 0.05, 0.07),
    )
    assert v.verdict == "worse" and v.status == "worse (it gets no more traffic)"
    assert (
        "3 % dearer per 1M tokens than fp32-control (95 % sure it is between 1 % cheaper and 7 % "
        "dearer), and its held-out loss is 6 % worse (95 % sure it is 5–7 % worse, beyond the 1 % "
        "margin): worse"
    ) in card_text(w, v)


def test_quality_not_measured_is_said_never_taken_as_equal(w):
    note = "no finished run of the arm evaluated eval_loss"
    v = said(
        w,
        deviation=-0.31,
        deviation_low=-0.38,
        deviation_high=-0.24,
        quality=quality("not_measured", note=note),
    )
    assert v.verdict == "cheaper" and not v.quality_joint
    assert v.quality.text == f"held-out quality not measured: {note}"
    assert f"conclusive Held-out quality not measured: {note}" in card_text(w, v)
    # a window before quality was weighed: said too
    none = said(w, deviation=-0.31, deviation_low=-0.38, deviation_high=-0.24, quality=None)
    assert none.quality.verdict == "not_measured"
    assert "Held-out quality not measured" in card_text(w, none)


def test_non_inferior_and_inconclusive_quality_in_words(w):
    cost = {"deviation": -0.31, "deviation_low": -0.38, "deviation_high": -0.24}
    v = said(w, **cost, quality=quality("non_inferior", 0.001, -0.004, 0.006))
    assert v.quality.text == (
        "held-out loss within 1 % of the control's (95 % sure it is between 0.4 % better and "
        "0.6 % worse)"
    )
    assert "Held-out loss within 1 % of the control's" in card_text(w, v)
    v = said(
        w, **cost, quality=quality("inconclusive", 0.008, note="the arm has 2 of 5 evaluated runs")
    )
    assert v.quality.text == (
        "held-out loss inconclusive: 0.8 % worse so far; the arm has 2 of 5 evaluated runs"
    )


# ---------------------------------------------------------------------------------------------
# Through the database: a lab whose candidate is 30 % cheaper with a 5 % worse held-out loss
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def lab():
    lab = Lab({"control": 1.0, "candidate": 0.7}, runs_per_arm=6, seed=3, min_cs_runs_per_arm=5)
    lab.run_ticks(2)
    finish(lab, {"control": 3.0, "candidate": 3.15})
    lab.step(runs=[])
    Run.objects.filter(pk=lab.runs[0].pk).update(priced_seq=lab.runs[0].priced_seq + 1)
    lab.tick()
    return lab


@pytest.fixture
def lab_member(client, lab):
    user = UserFactory()
    MembershipFactory(user=user, tenant=lab.experiment.tenant)
    client.force_login(user)
    return client


def test_the_card_and_the_quality_table_say_cheaper_but_worse(lab, lab_member):
    (v,) = experiment_verdicts(experiment=lab.experiment)
    assert v.verdict == "cheaper_but_worse" and v.amount.endswith("% cheaper")
    assert v.quality.amount.endswith("% worse") and v.status.startswith("cheaper but worse, frozen")
    page = lab_member.get(reverse("dashboard:experiment", args=[lab.experiment.pk]))
    html = page.content.decode()
    assert 'data-verdict="cheaper_but_worse"' in html and 'data-quality="worse"' in html
    row = re.search(
        rf'<tr data-arm="{lab.arms["candidate"].pk}" data-quality="worse">(.*?)</tr>', html, re.S
    )
    assert row, "the quality table has the candidate's row"
    cells = " ".join(strip_tags(row.group(1)).split())
    assert "not reached" in cells and "0 of 6 runs" in cells, cells
    assert 'id="chart-quality"' in html


def read_csv(response) -> list[dict]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_the_comparison_csv_has_the_quality_columns(lab, lab_member):
    response = lab_member.get(
        reverse("dashboard:experiment-comparison-csv", args=[lab.experiment.pk])
    )
    rows = {r["name"]: r for r in read_csv(response)}
    control, candidate = rows["control"], rows["candidate"]
    assert not any(k.startswith("quality.") for k in control), "said in columns of their own"
    assert (control["quality_verdict"], candidate["quality_verdict"]) == ("control", "worse")
    assert float(candidate["eval_loss_mean_final"]) == pytest.approx(3.15, rel=0.01)
    change = float(candidate["quality_change_vs_control (+ = worse)"])
    assert change == pytest.approx(0.05, abs=0.005)
    assert float(candidate["quality_change_low"]) > 0.01
    assert candidate["usd_to_target (est.)"] == "not reached", "the worse model never got there"
    assert float(control["usd_to_target (est.)"]) > 0
    assert candidate["runs_evaluated"] == "6" and candidate["runs_reached_target"] == "0"
    # the differences in words, as the page says them (issue 44); the signed columns stay numbers
    assert re.fullmatch(r"[\d.]+ % cheaper \([\d.]+–[\d.]+ %\)", candidate["deviation_said"])
    assert re.fullmatch(r"[\d.]+ % worse \([\d.]+–[\d.]+ %\)", candidate["quality_change_said"])
    assert float(candidate["deviation"]) < 0 and control["deviation_said"] == "control"
    target = "quality_target (eval_loss: the control's mean final)"
    assert float(control[target]) == pytest.approx(3.0, rel=0.01)


# ---------------------------------------------------------------------------------------------
# The chart: held-out loss against cumulative USD, one line per run, in its arm's colour
# ---------------------------------------------------------------------------------------------
def evaluated(arm, losses: list[float]) -> Run:
    """A run that trained 30 s through the real ingest, evaluating at seconds 10, 20 and 30."""
    run = run_of(arm, status=Run.Status.RUNNING)
    rows = samples(start=timezone.now() - timedelta(seconds=40), first_seq=0, n=30)
    for seq, loss in zip((9, 19, 29), losses, strict=True):
        rows[seq]["eval_loss"] = loss
    telemetry_ingest(run_id=run.pk, samples=rows, attempt=run.attempts)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    run.refresh_from_db()
    return run


def chart_of(member, w) -> dict:
    html = member.get(reverse("dashboard:experiment", args=[w.experiment.pk])).content.decode()
    found = re.search(r'<script id="quality-data" type="application/json">(.*?)</script>', html)
    return json.loads(found.group(1))


def test_the_quality_chart_draws_one_line_per_run_by_cost_in_its_arms_colour(member, w):
    controls = [evaluated(w.control, [4.0, 3.5, 3.2]), evaluated(w.control, [4.1, 3.6, 3.3])]
    candidate = evaluated(w.candidate, [4.2, 3.9, 3.7])
    run_of(w.candidate)  # no evaluation: no line
    chart = chart_of(member, w)
    assert [r["run"] for r in chart["runs"]] == [*(r.pk for r in controls), candidate.pk]
    assert {r["run"]: r["color"] for r in chart["runs"]} == {
        controls[0].pk: charts.ARM_COLORS[0],
        controls[1].pk: charts.ARM_COLORS[0],
        candidate.pk: charts.ARM_COLORS[1],
    }, "the arm's colour, as on the page's other charts"
    line = chart["runs"][2]
    assert line["y"] == [4.2, 3.9, 3.7] and line["tokens"] == sorted(line["tokens"])
    assert line["x"] == sorted(line["x"]) and 0 < line["x"][0] < line["x"][-1], "by USD so far"
    assert line["x"][-1] == pytest.approx(float(candidate.cost_usd), rel=1e-3)
    assert all(r["finished"] for r in chart["runs"])
    assert chart["target"] == pytest.approx(3.25), "the control's mean final value"
    assert chart["x_title"] == "USD (estimated, pro rata)" and "eval_loss" in chart["y_title"]


def test_the_quality_chart_is_empty_until_a_run_evaluates(member, w):
    evaluated_nothing = run_of(w.control)
    assert evaluated_nothing.pk
    chart = chart_of(member, w)
    assert chart["runs"] == [] and chart["target"] is None and chart["metric"] == "eval_loss"
