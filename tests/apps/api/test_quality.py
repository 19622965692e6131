"""Through the public API alone: a candidate 30 % cheaper per token whose held-out loss is 5 %
worse reads cheaper_but_worse and gains no traffic; at equal loss it reads cheaper."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.attribution.services import attribution_tick
from tests.factories import PricingTableFactory

pytestmark = pytest.mark.django_db


def run_trained(api, experiment, arm, *, start, tokens_per_s, eval_loss, **fields):
    """One external run of five minutes through the API: telemetry, a final evaluation, finish."""
    created = api.post(
        "/api/v1/runs/",
        {
            "experiment": experiment.pk,
            "arm": arm.pk,
            "kind": "external",
            "started_at": start.isoformat(),
            "ended_at": (start + timedelta(minutes=5)).isoformat(),
            **fields,
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    run = created.json()["id"]
    samples = [
        {
            "seq": i,
            "ts": (start + timedelta(seconds=10 * i)).isoformat(),
            "step": i,
            "power_w": 100.0,
            "energy_j": 1000.0 * i,
            "tokens": int(tokens_per_s * 10 * i),
            "util_pct": 90.0,
        }
        for i in range(31)
    ]
    samples[-1] |= {"eval_loss": eval_loss, "eval_s": 0.5}
    posted = api.post(f"/api/v1/runs/{run}/telemetry/", {"samples": samples}, format="json")
    assert posted.status_code == 200 and posted.json()["inserted"] == 31, posted.content
    done = api.post(f"/api/v1/runs/{run}/finish/", {"status": "succeeded"}, format="json")
    assert done.status_code == 200, done.content
    return run


@pytest.mark.parametrize(
    "candidate_loss, expected", [(3.15, "cheaper_but_worse"), (3.0, "cheaper")]
)
def test_a_cheaper_candidate_is_judged_on_its_held_out_loss_too(
    api, experiment, candidate_loss, expected
):
    PricingTableFactory(tenant=experiment.tenant, valid_from=timezone.now() - timedelta(days=30))
    patched = api.patch(
        f"/api/v1/experiments/{experiment.pk}/",
        {"min_runs_per_arm": 3, "min_cs_runs_per_arm": 3, "min_samples_per_arm": 10},
        format="json",
    )
    assert patched.status_code == 200, patched.content
    control, candidate = experiment.arms.get(name="control"), experiment.arms.get(name="candidate")
    rng, start = random.Random(5), timezone.now() - timedelta(hours=3)
    for i in range(4):
        for arm, speed, loss in ((control, 1000, 3.0), (candidate, 1000 / 0.7, candidate_loss)):
            run_trained(
                api,
                experiment,
                arm,
                start=start + timedelta(minutes=10 * i),
                tokens_per_s=speed * (1 + 0.01 * rng.gauss(0, 1)),
                eval_loss=loss * (1 + 0.001 * rng.gauss(0, 1)),
            )
    attribution_tick(now=timezone.now())
    report = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    arm = next(a for a in report["arms"] if a["name"] == "candidate")
    assert arm["verdict"] == expected, arm
    assert arm["deviation"] == pytest.approx(-0.3, abs=0.02)
    assert report["quality_metric"] == "eval_loss" and report["quality_target"] == pytest.approx(
        3.0, abs=0.01
    )
    weight = api.get(f"/api/v1/arms/{candidate.pk}/").json()["weight"]
    if expected == "cheaper_but_worse":
        assert arm["quality"]["verdict"] == "worse" and arm["state"] == "frozen"
        assert arm["quality"]["change"] == pytest.approx(0.05, abs=0.003)
        assert arm["usd_to_target"] is None and arm["runs_evaluated"] == 4
        assert float(weight) <= 1.0  # no traffic added
    else:
        assert arm["quality"]["verdict"] == "non_inferior" and arm["state"] == "active"
        assert arm["usd_to_target"] is not None and arm["runs_reached_target"] >= 1


def test_an_external_run_stores_its_eval_loss_and_a_bad_one_is_refused(api, experiment):
    PricingTableFactory(tenant=experiment.tenant, valid_from=timezone.now() - timedelta(days=30))
    start = timezone.now() - timedelta(hours=1)
    run = run_trained(
        api,
        experiment,
        experiment.arms.get(name="control"),
        start=start,
        tokens_per_s=10,
        eval_loss=2.5,
    )
    from apps.telemetry.models import RunEvaluation

    assert list(RunEvaluation.objects.filter(run_id=run).values_list("metric", "value")) == [
        ("eval_loss", 2.5)
    ]
    # the run's own answer says it, with the seconds the evaluation took (billed, reported apart)
    said = api.get(f"/api/v1/runs/{run}/").json()["evaluations"]
    assert said == {
        "eval_loss": {
            "evaluations": 1,
            "eval_s": 0.5,
            "last": 2.5,
            "step": 30,
            "tokens": 3000,
            "higher_is_better": False,
        }
    }
    other = api.post(
        "/api/v1/runs/",
        {"experiment": experiment.pk, "kind": "external", "started_at": start.isoformat()},
        format="json",
    ).json()["id"]
    bad = [{"seq": 0, "ts": start.isoformat(), "eval_loss": -1.0}]
    refused = api.post(f"/api/v1/runs/{other}/telemetry/", {"samples": bad}, format="json")
    assert (
        refused.status_code == 400 and "samples[0].eval_loss" in refused.json()["error"]["message"]
    )
