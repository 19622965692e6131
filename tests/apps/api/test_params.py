"""A run's training metrics and reported parameters through the API: the run's answer sums them up,
a metric's series comes by step (downsampled in SQL past 2,000 points), and parameters compare
between two of the team's runs (another team's run is 404) and between two arms (a missing arm is
a 400 naming the parameter)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.experiments.models import Run
from apps.telemetry.models import RunMetric
from tests.apps.api.conftest import error
from tests.factories import ArmFactory, CostModelFactory, ExperimentFactory, RunFactory

pytestmark = pytest.mark.django_db

BASE = {"learning_rate": 3e-4, "optim": {"name": "adamw", "betas": [0.9, 0.95]}, "seed": 1}


def run_with(arm, params=None, status=Run.Status.SUCCEEDED, **hyper):
    return RunFactory(
        arm=arm,
        status=status,
        params=params or {"hyperparameters": {**BASE, **hyper}, "model": {"hidden_size": 64}},
    )


def test_a_runs_answer_sums_up_its_metrics_and_a_series_comes_downsampled(api, experiment):
    run = run_with(experiment.arms.get(name="control"))
    now = timezone.now()
    RunMetric.objects.bulk_create(
        [
            RunMetric(run=run, seq=i, ts=now, step=i, name="loss", value=10.0 - i / 1024)
            for i in range(2500)
        ]
        + [RunMetric(run=run, seq=i, ts=now, step=i, name="grad_norm", value=0.5) for i in (10, 20)]
    )
    detail = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert detail["params"]["hyperparameters"]["optim"]["name"] == "adamw"
    assert detail["metrics"] == {
        "grad_norm": {"count": 2, "first_step": 10, "step": 20, "last": 0.5},
        "loss": {"count": 2500, "first_step": 0, "step": 2499, "last": 10.0 - 2499 / 1024},
    }
    series = api.get(f"/api/v1/runs/{run.pk}/metrics/", {"name": "loss"}).json()
    assert series["downsampled"] and series["count"] == 2500
    assert len(series["step"]) == len(series["value"]) <= 2000 and series["bucket_steps"] == 2
    assert series["step"][-1] == 2499 and series["min"][0] <= series["value"][0] <= series["max"][0]
    whole = api.get(f"/api/v1/runs/{run.pk}/metrics/", {"name": "grad_norm"}).json()
    assert (whole["downsampled"], whole["step"], whole["value"]) == (False, [10, 20], [0.5, 0.5])
    missing = api.get(f"/api/v1/runs/{run.pk}/metrics/", {"name": "eval_accuracy"})
    assert missing.status_code == 404 and "eval_accuracy" in error(missing)["message"]


def test_two_runs_params_differ_by_key_and_another_teams_run_is_404(api, experiment, other_tenant):
    control = experiment.arms.get(name="control")
    mine = run_with(control, learning_rate=1e-3, warmup_steps=10)
    other = run_with(control, optim={"name": "sgd", "betas": [0.9, 0.95]})
    answer = api.get(f"/api/v1/runs/{mine.pk}/params/", {"against": other.pk}).json()
    assert answer["flat"]["optim.name"] == "adamw" and answer["flat"]["model.hidden_size"] == 64
    assert answer["diff"] == [
        {"key": "learning_rate", "this": 1e-3, "other": 3e-4},
        {"key": "optim.name", "this": "adamw", "other": "sgd"},
        {"key": "warmup_steps", "this": 10, "other": None, "only": "this"},
    ]
    assert answer["same"] == 3  # optim.betas, seed, model.hidden_size
    theirs = run_with(
        ArmFactory(
            experiment=ExperimentFactory(
                tenant=other_tenant, cost_model=CostModelFactory(tenant=other_tenant)
            )
        )
    )
    refused = api.get(f"/api/v1/runs/{mine.pk}/params/", {"against": theirs.pk})
    assert refused.status_code == 404 and "against" in error(refused)["message"]
    assert api.get(f"/api/v1/runs/{theirs.pk}/params/").status_code == 404


def test_two_arms_compare_on_the_params_their_finished_runs_agree_on(api, experiment):
    control, candidate = experiment.arms.get(name="control"), experiment.arms.get(name="candidate")
    run_with(control, seed=1)
    run_with(control, seed=2)  # the seed varies within the arm: not the arm's
    run_with(control, learning_rate=1.0, status=Run.Status.FAILED)  # not finished well: not counted
    run_with(candidate, seed=1, learning_rate=1e-3)
    answer = api.get(
        f"/api/v1/experiments/{experiment.pk}/params-diff/", {"a": "control", "b": candidate.pk}
    ).json()
    assert (answer["a"]["runs"], answer["a"]["varying"], answer["b"]["name"]) == (
        2,
        ["seed"],
        "candidate",
    )
    assert answer["diff"] == [
        {"key": "learning_rate", "this": 3e-4, "other": 1e-3},
        {"key": "seed", "this": None, "other": 1, "only": "other"},
    ]
    for params, named in (({"a": "control", "b": "nope"}, "b"), ({"b": "control"}, "a")):
        refused = api.get(f"/api/v1/experiments/{experiment.pk}/params-diff/", params)
        assert refused.status_code == 400 and named in error(refused)["fields"], refused.json()
