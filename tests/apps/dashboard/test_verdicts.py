"""The verdict card's words: attribution's verdict said per unit of work, bounds clipped to what a
cost can be, what evidence is missing, when an arm was frozen; the same in the experiments list."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.attribution.report import ExperimentReport
from apps.attribution.services import arm_freeze, attribution_tick
from apps.dashboard.verdicts import experiment_verdicts, runs_needed
from tests.apps.dashboard.world import run_of, train
from tests.factories import arm_report

pytestmark = pytest.mark.django_db

CONTROL = arm_report(name="fp32-control", is_control=True, runs=6, runs_succeeded=6)
ARM = replace(CONTROL, arm_id=2, name="bf16-dynamic", is_control=False, runs=4)


def say(w, **changes):
    report = ExperimentReport(
        experiment_id=w.experiment.pk,
        name="e",
        target_steps=None,
        window_end=None,
        pricing_table=None,
        arms=[CONTROL, replace(ARM, **changes)],
    )
    (verdict,) = experiment_verdicts(experiment=w.experiment, report=report)
    return verdict


def test_conclusive_cheaper_per_unit_of_work(w):
    v = say(w, deviation=-0.31, deviation_low=-0.38, deviation_high=-0.24)
    assert (v.verdict, v.status, v.amount, v.per) == (
        "cheaper",
        "conclusive",
        "31 % cheaper",
        "per 1M tokens",
    )
    assert v.bound == "always-valid bound 24–38 %"
    dearer = say(w, deviation=0.12, deviation_low=0.07, deviation_high=0.17, metric="usd_per_step")
    assert (dearer.status, dearer.amount, dearer.per) == ("conclusive", "12 % dearer", "per step")


def test_inconclusive_says_how_many_runs_it_needs_and_clips_the_bound(w):
    v = say(w, deviation=0.179, deviation_low=-2.18, deviation_high=2.54, runs=4)
    assert v.verdict == "inconclusive" and v.status == "inconclusive"
    assert v.low == -1.0 and v.bound == "always-valid bound −100 % to +254 %", (
        "a cost is never below −100 %"
    )
    needed = runs_needed(deviation=0.179, low=-2.18, high=2.54, runs=4, threshold=0.05, min_runs=10)
    assert v.runs_needed == needed and needed > 1000, "a bound that wide needs many more runs"
    assert f"needs about {needed} more runs per arm" in v.detail
    assert "4 runs of bf16-dynamic, 6 of fp32-control" in v.detail


def test_runs_needed():
    # Half-width 0.1 at 10 runs, margin 0.05: four times the runs (1/sqrt(n)), so 30 more.
    assert runs_needed(deviation=0.10, low=0.0, high=0.2, runs=10, threshold=0.05, min_runs=3) == 30
    # The minimums ask for more than the spread does.
    assert runs_needed(deviation=0.5, low=0.4, high=0.6, runs=2, threshold=0.05, min_runs=10) == 8


def test_within_the_threshold_and_no_data(w):
    v = say(w, deviation=0.02, deviation_low=-0.01, deviation_high=0.04)
    assert (
        v.verdict == "within_threshold" and v.status == "within the ±5 % threshold" and not v.detail
    )
    wide = say(w, deviation=0.02, deviation_low=-0.2, deviation_high=0.3)
    assert "more runs would settle it" in wide.detail
    none = say(w, deviation=None)
    assert none.status == "no verdict yet" and none.amount == ""


def test_frozen_says_when_and_by_how_much(w):
    arm_freeze(arm_id=w.candidate.pk, reason="dearer beyond the bound", evidence={})
    event = w.candidate.freeze_events.get()
    event.deviation = 0.12
    event.save()
    report = ExperimentReport(
        experiment_id=w.experiment.pk,
        name="e",
        target_steps=None,
        window_end=None,
        pricing_table=None,
        arms=[
            replace(CONTROL, arm_id=w.control.pk),
            replace(ARM, arm_id=w.candidate.pk, state="frozen"),
        ],
    )
    (v,) = experiment_verdicts(experiment=w.experiment, report=report)
    assert (
        v.verdict == "frozen"
        and v.status == f"frozen at {timezone.localtime(event.created_at):%H:%M}"
    )
    assert v.amount == "12 % dearer" and v.detail == "dearer beyond the bound"


def test_page_and_list_say_the_verdict(member, w):
    """Identical runs per arm (no spread): a tight bound, a conclusive verdict, on the page and in
    the list."""
    start = timezone.now() - timedelta(minutes=5)
    for arm, power in ((w.control, 600.0), (w.candidate, 150.0)):
        for _ in range(3):
            train(run_of(arm), n=20, start=start, power_w=power)
    attribution_tick(now=timezone.now())
    page = member.get(reverse("dashboard:experiment", args=[w.experiment.pk])).content.decode()
    card = page.split('id="verdict-card"')[1].split("</section>")[0]
    assert (
        "optimized is <strong>" in card and "cheaper</strong> per 1M tokens than baseline" in card
    ), card
    assert "conclusive" in card
    assert page.index('id="verdict-card"') < page.index('id="comparison-measured"'), (
        "the verdict comes first"
    )
    listed = member.get(reverse("dashboard:experiments")).content.decode()
    cell = listed.split('data-col="verdict"')[1].split("</td>")[0]
    assert 'data-verdict="cheaper"' in cell and "conclusive" in cell, cell
    fragment = member.get(
        reverse("dashboard:experiment-comparison", args=[w.experiment.pk])
    ).content.decode()
    for part in (
        'id="verdict-card"',
        'id="facts"',
        'id="comparison-fragment"',
        'id="runs-fragment"',
    ):
        assert part in fragment, part
