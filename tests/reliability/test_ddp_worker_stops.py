"""A DDP run's worker stopped (SIGTERM) or killed (SIGKILL): every rank stops with it, none is left.

The ranks run in sessions of their own (torch's launcher starts them so), so a signal to the
worker's process group never reaches them: SIGTERM reaches them through the run's owner, at one
step boundary, and a rank whose owner died exits by itself."""

import os
import signal
import time

import psutil
import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from apps.telemetry.models import TelemetrySample
from tests.helpers import rank_processes, start_worker, stop_worker
from tests.workers.test_runs_on_a_worker import experiment_with, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

LONG_DDP = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 100000, global_batch: 4, seed: 1}
telemetry: {interval_s: 0.2}
distributed: {nproc_per_node: 2}
"""


def _ranks_of(worker) -> list[psutil.Process]:
    return rank_processes(worker.pid)


def _gone(procs: list[psutil.Process], within_s: float) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=within_s)
    return not alive


def _training_on_both_ranks(worker, run) -> list[psutil.Process]:
    wait_for(
        lambda: TelemetrySample.objects.filter(run=run, rank=1).count() >= 2,
        120,
        "both ranks to train",
    )
    ranks = _ranks_of(worker)
    assert len(ranks) == 2
    return ranks


def test_sigterm_hands_a_ddp_run_back_and_stops_both_ranks(django_db_setup):
    worker, _ = start_worker()
    try:
        run = run_submit(experiment=experiment_with(LONG_DDP))
        ranks = _training_on_both_ranks(worker, run)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=40)
    finally:
        if worker.poll() is None:
            stop_worker(worker)
    assert _gone(ranks, within_s=10)
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and "worker stopped before the run finished" in run.error
    assert list(run.attempt_log.values_list("outcome", flat=True)) == ["stopped"]
    assert run.steps > 0 and run.cost_usd > 0
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)


def test_a_killed_worker_leaves_no_rank_behind(django_db_setup):
    worker, _ = start_worker()
    try:
        run = run_submit(experiment=experiment_with(LONG_DDP))
        ranks = _training_on_both_ranks(worker, run)
        os.killpg(
            worker.pid, signal.SIGKILL
        )  # the worker and its pool child; the ranks are not in the group
        worker.wait(10)
        started = time.monotonic()
        assert _gone(ranks, within_s=10), [p.pid for p in ranks if p.is_running()]
        assert time.monotonic() - started < 10
    finally:
        if worker.poll() is None:
            stop_worker(worker)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)
