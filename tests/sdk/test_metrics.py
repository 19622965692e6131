"""Training metrics and parameters from runs that train elsewhere: `run.log_metrics` leaves out
what the server cannot take (said once per name on stderr, never raised into the training) and
`run.log_params` makes the parameters JSON within 64 KiB; both go as samples of their own and are
stored once, at the step they were taken at."""

from __future__ import annotations

import math
import time

import torch

import costlab
from apps.experiments.models import Run
from apps.telemetry.models import RunMetric
from tests.sdk.conftest import HELD
from tests.sdk.test_evaluations import live


def test_log_metrics_leaves_out_what_the_server_refuses_and_says_it_once(capsys):
    run = costlab.Run(1, "control", run_key="metrics", rank=0, world_size=1)  # never started
    run.log(step=3, tokens=40)
    for _ in range(2):
        run.log_metrics(
            {"loss": torch.tensor(2.5), "lr": 3e-4, "nan": math.nan, "top 1": 1, "s": "x"}
        )
    run.log_metrics({"eval_accuracy": 0.5}, step=2)
    err = capsys.readouterr().err
    assert err.count("metrics left out") == 1  # the same names are said once
    assert "'nan' (must be finite" in err and "'top 1'" in err and "'s' (expected a number" in err
    assert [e.fields for e in run._evaluations] == [
        {"metrics": {"loss": 2.5, "lr": 3e-4}, "metrics_step": 3},
        {"metrics": {"loss": 2.5, "lr": 3e-4}, "metrics_step": 3},
        {"metrics": {"eval_accuracy": 0.5}, "metrics_step": 2},
    ]
    run.log_params({"dtype": torch.bfloat16, "betas": (0.9, 0.95), "huge": "x" * 70_000, 1: None})
    (params,) = [e.fields["params"] for e in run._evaluations if "params" in e.fields]
    assert params["hyperparameters"]["dtype"] == "torch.bfloat16"
    assert (
        params["hyperparameters"]["betas"] == [0.9, 0.95] and params["hyperparameters"]["1"] is None
    )
    assert params["hyperparameters"]["huge"].startswith("(left out: 70")
    assert "left out: huge" in capsys.readouterr().err
    other_rank = costlab.Run(1, "control", run_key="metrics", rank=1, world_size=2)
    other_rank.log_metrics({"loss": 1.0})
    other_rank.log_params({"lr": 1.0})
    assert not other_rank._evaluations  # checked, then left to rank 0


@live
def test_metrics_and_params_reach_the_run_once_at_their_steps(served):
    with costlab.track(
        served["experiment"].pk,
        "candidate",
        interval_s=0.05,
        send_every_s=0.1,
        device="cpu",
        **HELD,
    ) as run:
        run.log_params({"learning_rate": 3e-4, "optim": {"name": "adamw"}})
        run.log_params({"hidden_size": 64}, kind="model")
        for step in range(1, 6):
            run.log(step=step, tokens=100)
            run.log_metrics({"loss": 3.0 - step / 10, "grad_norm": 1.0})
        run.log_metrics({"eval_accuracy": 0.25}, step=4)
        run.log_params({"learning_rate": 1e-3})  # replaces that key, keeps the others
        time.sleep(0.2)
    assert run.status == "succeeded"
    stored = list(
        RunMetric.objects.filter(run_id=run.run_id, name__in=["loss", "eval_accuracy"])
        .order_by("seq")
        .values_list("name", "step", "value")
    )
    assert stored == [*(("loss", s, 3.0 - s / 10) for s in range(1, 6)), ("eval_accuracy", 4, 0.25)]
    assert RunMetric.objects.filter(run_id=run.run_id, name="grad_norm").count() == 5
    assert Run.objects.get(pk=run.run_id).params == {
        "hyperparameters": {"learning_rate": 1e-3, "optim": {"name": "adamw"}},
        "model": {"hidden_size": 64},
    }
