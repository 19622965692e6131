"""A run across two nodes: gang-scheduled as two tasks on two real workers that meet at one c10d
rendezvous (recorded on the run); with one worker only, the node gives up at the join timeout, the
run is requeued once with the reason, then fails."""

import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from apps.telemetry.models import TelemetrySample
from tests.helpers import start_worker, stop_worker
from tests.workers.test_runs_on_a_worker import experiment_with, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

TWO_NODES = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 15, global_batch: 4, seed: 1}
telemetry: {interval_s: 0.2}
distributed: {nproc_per_node: 1, nnodes: 2}
"""


def test_two_workers_train_one_run_as_two_nodes(django_db_setup):
    workers = [start_worker(COSTLAB_RDZV_JOIN_TIMEOUT_S="60")[0] for _ in range(2)]
    try:
        run = run_submit(experiment=experiment_with(TWO_NODES))
        run = wait_for(
            lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
            240,
            "the run to end",
        )
    finally:
        for worker in workers:
            stop_worker(worker)
    assert run.status == "succeeded", run.error
    assert run.rdzv_endpoint.startswith("127.0.0.1:") and run.rdzv_id == f"costlab-run-{run.pk}-1"
    assert run.nodes_joined == 2 and run.attempts == 1 and run.world_size == 2
    rows = list(TelemetrySample.objects.filter(run=run).values_list("rank", "seq"))
    assert {rank for rank, _ in rows} == {0, 1}
    assert run.steps == 15 and run.tokens == 15 * 4 * 32  # the world's progress, counted once


def test_a_gang_missing_a_node_is_requeued_once_then_fails_with_the_reason(django_db_setup):
    worker, _ = start_worker(COSTLAB_RDZV_JOIN_TIMEOUT_S="4")
    try:
        run = run_submit(experiment=experiment_with(TWO_NODES))
        run = wait_for(
            lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
            120,
            "the run to give up",
        )
    finally:
        stop_worker(worker)
    assert run.status == "failed" and run.gang_requeues == 1
    assert "not every node joined" in run.error and "again after one requeue" in run.error
    first, second = run.attempt_log.order_by("number")
    assert (
        first.outcome == "stopped" and "not every node joined" in first.reason
    )  # the requeue, with its reason
    assert second.outcome == "failed"
