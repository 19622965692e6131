"""Held-out evaluations from runs that train elsewhere: `run.log_eval` refuses a bad value at the
call, naming the argument, and queues nothing; a good one goes as a telemetry sample of its own
(its own seq, the step and tokens of its moment) and is stored once, through an outage, a lost
answer and a resend of the spool."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

import costlab
from apps.telemetry.models import RunEvaluation, TelemetrySample
from costlab.client import Client
from costlab.delivery import Sender
from costlab.integrations import EvalReporter
from costlab.sampler import Evaluation, Progress, Sampler
from tests.reliability.private import free_port
from tests.sdk.conftest import HELD
from tests.sdk.test_delivery import FixedProbe


def live(test):
    """A test against the live server (a thread of this process) and the committed database."""
    for mark in (pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)):
        test = mark(test)
    return test


def evaluations_of(run_id: int) -> list[tuple]:
    return list(
        RunEvaluation.objects.filter(run_id=run_id)
        .order_by("seq", "metric")
        .values_list("seq", "step", "tokens", "metric", "value", "higher_is_better", "eval_s")
    )


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ({"eval_loss": math.nan}, "eval_loss: must be finite"),
        ({"eval_loss": math.inf}, "eval_loss: must be finite"),
        ({"eval_loss": -0.5}, "eval_loss: must be >= 0"),
        ({"eval_loss": torch.tensor(float("nan"))}, "eval_loss: must be finite"),
        ({"eval_loss": torch.ones(2)}, "eval_loss: expected a number or a 0-d tensor"),
        ({"eval_loss": "2.9"}, "eval_loss: expected a number"),
        ({"eval_loss": 2e6}, "eval_loss: must be >= 0 and at most 1e6"),
        ({"metric": "accuracy", "value": 0.9}, "direction: say which way is better for 'accuracy'"),
        ({"metric": "accuracy", "value": 0.9, "direction": "up"}, "direction: say which way"),
        ({"metric": "top 1", "value": 0.9, "direction": "higher"}, "metric: a name of 1-64"),
        ({"metric": "accuracy", "direction": "higher"}, "value: metric 'accuracy' needs"),
        ({"metric": "f1", "value": math.nan, "direction": "higher"}, "value: must be finite"),
        ({"value": 0.9, "direction": "higher"}, "metric: name the metric"),
        ({"metric": "eval_loss", "value": 2.0, "direction": "higher"}, "direction: eval_loss"),
        ({"eval_loss": 2.0, "eval_s": -1.0}, "eval_s: must be >= 0"),
        ({}, "eval_loss: give the held-out loss"),
    ],
)
def test_log_eval_refuses_bad_input_naming_the_argument_and_queues_nothing(call, named):
    run = costlab.Run(
        1, "control", run_key="refusals", rank=0, world_size=1
    )  # never started: no server needed
    with pytest.raises(ValueError, match=named):
        run.log_eval(**call)
    assert not run._evaluations


def test_log_eval_takes_numbers_and_0d_tensors_with_the_progress_of_its_moment():
    run = costlab.Run(1, "control", run_key="accepted", rank=0, world_size=1)
    run.log(step=3, tokens=40)
    run.log_eval(torch.tensor(2.5), eval_s=1)
    run.log(step=4, tokens=40)
    run.log_eval(metric="accuracy", value=torch.tensor(0.75), direction="higher")
    run.log_eval(metric="eval_loss", value=2.25)  # the loss by its name: as eval_loss
    first, second, third = run._evaluations
    assert (first.progress.step, first.fields) == (3, {"eval_loss": 2.5, "eval_s": 1.0})
    assert second.progress.step == 4
    assert second.fields == {"quality": {"name": "accuracy", "value": 0.75, "direction": "higher"}}
    assert third.fields == {"eval_loss": 2.25}
    other_rank = costlab.Run(1, "control", run_key="accepted", rank=1, world_size=2)
    other_rank.log_eval(2.5)  # checked, then left to rank 0: the run's evaluation is rank 0's
    assert not other_rank._evaluations


def test_the_callbacks_refuse_a_metric_with_no_direction():
    from costlab.integrations.lightning import CostlabCallback as LightningCallback
    from costlab.integrations.transformers import CostlabCallback as TrainerCallback

    for callback in (TrainerCallback, LightningCallback):
        with pytest.raises(ValueError, match="quality_direction: say which way .* 'accuracy'"):
            callback(1, "control", quality_metric="accuracy")
        with pytest.raises(ValueError, match="quality_metric: a name"):
            callback(1, "control", quality_metric="val/acc", quality_direction="higher")
        with pytest.raises(ValueError, match="quality_metric: name the metric"):
            callback(1, "control", quality_direction="higher")


def test_a_diverged_evaluation_is_said_never_raised_into_the_training(capsys):
    run = costlab.Run(1, "control", run_key="diverged", rank=0, world_size=1)
    reporter = EvalReporter(
        eval_loss="eval_loss", quality_metric="accuracy", quality_direction="higher"
    )
    reporter.report(run, {"eval_loss": math.nan, "accuracy": 0.5}, eval_s=1.0, step=7)
    reporter.report(run, {"eval_loss": 2.0}, eval_s=1.0, step=8)  # no accuracy: said once
    reporter.report(run, {"eval_loss": 1.5}, eval_s=1.0, step=9)
    err = capsys.readouterr().err
    assert "evaluation at step 7 is not reported: eval_loss: must be finite" in err
    assert err.count("metric 'accuracy' is not among") == 1
    assert [e.fields["eval_loss"] for e in run._evaluations] == [2.0, 1.5]


def test_an_evaluation_goes_as_a_sample_of_its_own_before_any_later_reading():
    """Two evaluations within one interval are two samples, each with the step and tokens of its
    moment, none merged into the periodic reading, and the stream's counters never run back."""
    out: list[dict] = []
    progress = {"p": Progress(0, 0, None, 0.0, 0, None, time.perf_counter())}
    sampler = Sampler(
        probe=FixedProbe(), progress=lambda: progress["p"], interval_s=3600, emit=out.append
    )
    sampler.start()  # seq 0
    for step in (1, 2):
        progress["p"] = progress["p"]._replace(step=step, tokens_own=10 * step)
        sampler.evaluations.append(Evaluation(progress["p"], {"eval_loss": 3.0 - step}))
    progress["p"] = progress["p"]._replace(step=5, tokens_own=50)  # training went on
    sampler.sample()
    sampler.stop()
    assert [s["seq"] for s in out] == [0, 1, 2, 3, 4]
    assert [(s["step"], s["tokens"], s.get("eval_loss")) for s in out] == [
        (0, 0, None),
        (1, 10, 2.0),
        (2, 20, 1.0),
        (5, 50, None),
        (5, 50, None),
    ]
    assert not sampler.evaluations


@live
def test_an_evaluation_logged_while_the_site_is_down_is_stored_once(served, monkeypatch):
    """The site stops answering mid-job; an evaluation is logged during the outage; the first
    answer after it is lost (stored, then the connection drops: the batch is sent again). The
    evaluation arrives once, at the step and tokens it was taken at, on its own sample."""
    monkeypatch.setattr(Sender, "MAX_BACKOFF_S", 0.2)
    post = Client.post_samples
    site = {"down": False, "lose_next_answer": False}

    def flaky(self, run_id, samples, timeout_s):
        if site["down"]:
            raise ConnectionError("site down")
        answer = post(self, run_id, samples, timeout_s)
        if site["lose_next_answer"]:
            site["lose_next_answer"] = False
            raise ConnectionError("answer lost")
        return answer

    monkeypatch.setattr(Client, "post_samples", flaky)
    with costlab.track(
        served["experiment"].pk,
        "candidate",
        interval_s=0.05,
        send_every_s=0.1,
        device="cpu",
        **HELD,
    ) as run:
        for step in range(1, 6):
            run.log(step=step, tokens=100)
        time.sleep(0.3)
        site["down"] = True
        time.sleep(0.2)
        run.log_eval(2.5, eval_s=0.5)
        run.log_eval(metric="accuracy", value=0.4, direction="higher")
        for step in range(6, 11):
            run.log(step=step, tokens=100)
        time.sleep(0.3)
        site["down"], site["lose_next_answer"] = False, True
        time.sleep(0.3)
    assert run.status == "succeeded" and not site["lose_next_answer"]
    stored = evaluations_of(run.run_id)
    (loss_seq, *loss), (accuracy_seq, *accuracy) = stored
    assert loss == [5, 500, "eval_loss", 2.5, False, 0.5]
    assert accuracy == [5, 500, "accuracy", 0.4, True, None]
    assert loss_seq != accuracy_seq  # two calls, two samples
    seqs = sorted(TelemetrySample.objects.filter(run_id=run.run_id).values_list("seq", flat=True))
    assert seqs == list(range(run.samples))  # nothing lost or stored twice around them


@live
def test_an_evaluation_left_in_the_spool_is_delivered_by_resend(served, tmp_path, monkeypatch):
    """The site is down for the whole job: the evaluation waits in the spool with the samples,
    at the step and tokens it was taken at; resend creates the run and delivers it, once."""
    from costlab import run as sdk_run

    monkeypatch.setattr(sdk_run, "START_WAIT_S", 0.5)
    with costlab.track(
        served["experiment"].pk,
        "candidate",
        url=f"http://127.0.0.1:{free_port()}",
        interval_s=0.05,
        buffer_size=2,
        flush_timeout_s=0.5,
        spool_dir=tmp_path / "spool",
        device="cpu",
    ) as run:
        for step in range(1, 4):
            run.log(step=step, tokens=50)
        run.log_eval(3.25)
        run.log(step=4, tokens=50)
    assert run.run_id is None and run.samples_left == run.samples
    spooled = [
        json.loads(line)
        for segment in sorted(run.spool_path.glob("segment-*.jsonl"))
        for line in segment.read_text().splitlines()
    ]
    assert [s["eval_loss"] for s in spooled if "eval_loss" in s] == [3.25]
    done = costlab.resend(run.spool_path, url=served["url"])
    assert done["status"] == "succeeded" and done["sent"] == run.samples
    assert [row[1:5] for row in evaluations_of(done["run_id"])] == [(3, 150, "eval_loss", 3.25)]
