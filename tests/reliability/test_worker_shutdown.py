"""A worker told to stop (SIGTERM, as `docker stop` does) hands its run back to the queue at
a step boundary, keeping what was measured, and exits promptly instead of training on."""

import signal
import time

import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from apps.telemetry.models import TelemetrySample
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import start_worker, stop_worker
from tests.workers.test_runs_on_a_worker import LONG, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_sigterm_requeues_the_run_at_a_step_boundary_and_the_worker_exits(django_db_setup):
    price = GpuPriceFactory()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=LONG)
    worker, _ = start_worker()
    try:
        run = run_submit(experiment=exp)
        wait_for(lambda: TelemetrySample.objects.filter(run=run).count() >= 3, 120, "telemetry")
        asked = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        took = time.monotonic() - asked
    finally:
        if worker.poll() is None:
            stop_worker(worker)
    run.refresh_from_db()
    assert took < 15, f"worker took {took:.1f} s to stop"
    assert run.status == Run.Status.QUEUED and run.attempts == 1
    assert "worker stopped before the run finished" in run.error
    assert list(run.attempt_log.values_list("outcome", flat=True)) == ["stopped"]  # not a failure
    assert run.steps > 0 and run.cost_usd > 0  # the first attempt's measurements are kept
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)


MEDIUM = LONG.replace("steps: 100000", "steps: 80")


def test_three_graceful_stops_use_no_attempt_and_the_run_still_succeeds(django_db_setup):
    """Three deploys in a row (SIGTERM each time) used to end a healthy run
    "no attempts left (3/3)"."""
    price = GpuPriceFactory()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=MEDIUM)
    run = None
    for stop in range(1, 4):
        worker, _ = start_worker()
        try:
            if run is None:
                run = run_submit(experiment=exp)
            wait_for(
                lambda n=stop, r=run: TelemetrySample.objects.filter(run=r, attempt=n).count() >= 2,
                120,
                f"attempt {stop} to train",
            )
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                stop_worker(worker)
        run.refresh_from_db()
        assert run.status == Run.Status.QUEUED, (stop, run.status, run.error)
    worker, _ = start_worker()
    try:
        run = wait_for(
            lambda: Run.objects.filter(pk=run.pk).exclude(status__in=Run.ACTIVE_STATUSES).first(),
            180,
            "the fourth attempt to finish",
        )
    finally:
        stop_worker(worker)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert list(run.attempt_log.values_list("outcome", flat=True)) == [
        "stopped",
        "stopped",
        "stopped",
        "succeeded",
    ]
    assert run.attempts == 4 and run.max_attempts == 3


class Killed(Exception):
    """What SIGTERM does to a Celery pool child outside training: it ends the process."""


@pytest.mark.parametrize("window", ["runs.run_claim", "run_profile", "runs.run_device_record"])
def test_sigterm_before_training_starts_hands_the_run_back(window, monkeypatch, django_db_setup):
    """CI caught `make run`'s Ctrl-C between the claim and the first step: the pool child died
    with the run marked running, and only the lease reaper would have put it back."""
    from workers import training

    exp = ExperimentFactory(tenant=GpuPriceFactory().pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=LONG)
    run = run_submit(experiment=exp)
    owner, name = (training.runs, window.split(".")[1]) if "." in window else (training, window)
    real = getattr(owner, name)

    def then_sigterm(*args, **kwargs):
        out = real(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # handled on the next bytecode, in this thread
        return out

    def killed(signum, frame):
        raise Killed

    monkeypatch.setattr(owner, name, then_sigterm)
    previous = signal.signal(signal.SIGTERM, killed)
    try:
        with pytest.raises(Killed):  # the held SIGTERM goes on to the handler before
            training.run_execute(run.pk)
    finally:
        signal.signal(signal.SIGTERM, previous)
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED, (run.status, run.error)
    assert "worker stopped before the run started training" in run.error
    assert not TelemetrySample.objects.filter(run=run).exists()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)
