"""assign=True: the server picks the arm before training starts, sticky per run key: the ranks of
one job (one key) get the same arm, strategy and run; the strategy comes parsed with its defaults,
ready for to_trainer_args; a finished run's key is refused rather than reopened."""

from __future__ import annotations

import pytest
from django.urls import Resolver404, resolve

import costlab
from apps.experiments.models import Arm, Run
from costlab.strategy import to_trainer_args

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _assign_route_exists() -> bool:
    try:
        resolve("/api/v1/experiments/1/assign/")
    except Resolver404:
        return False
    return True


@pytest.mark.skipif(not _assign_route_exists(), reason="POST experiments/{id}/assign/ not built")
def test_the_ranks_of_one_job_are_assigned_one_arm_sticky_by_run_key(served):
    exp = served["experiment"]
    Arm.objects.filter(experiment=exp).exclude(name="ddp").update(weight=0)  # ddp takes them all
    Arm.objects.filter(experiment=exp, name="ddp").update(weight=1)
    first = costlab.track(exp.pk, assign=True, run_key="job-1", rank=0, world_size=2, device="cpu")
    second = costlab.track(exp.pk, assign=True, run_key="job-1", rank=1, world_size=2, device="cpu")
    with first, second:
        first.log(tokens=8)
        second.log(tokens=8)
    assert (first.arm, second.arm) == ("ddp", "ddp") and first.run_id == second.run_id
    assert (first.sticky, second.sticky) == (False, True)
    assert (
        first.strategy == second.strategy and first.strategy["distributed"]["nproc_per_node"] == 2
    )
    assert first.strategy["train"]["lr"] == 3.0e-4  # a default, filled in
    assert first.interval_s == first.strategy["telemetry"]["interval_s"]
    # only what the arm's YAML sets: the defaults (lr, decay, scheduler, ...) stay the script's
    assert first.declared == {
        "model": {"preset": "tiny", "seq_len": 32},
        "data": {"source": "synthetic"},
        "train": {"steps": 10, "global_batch": 4},
        "distributed": {"nproc_per_node": 2},
    }
    kwargs, unmapped, _ = to_trainer_args(first)
    assert kwargs == {
        "per_device_train_batch_size": 2,  # 4 over 2
        "gradient_accumulation_steps": 1,
        "max_steps": 10,
    }
    assert set(unmapped) == {
        "model.preset",
        "model.seq_len",
        "data.source",
        "distributed.nproc_per_node",
    }
    row = Run.objects.get(pk=first.run_id)
    assert (row.arm.name, row.status, row.run_key) == ("ddp", "succeeded", "job-1")
    with pytest.raises(Exception, match="already succeeded"):
        costlab.track(exp.pk, assign=True, run_key="job-1", device="cpu").start()
