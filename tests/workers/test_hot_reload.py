"""Hot reload: an arm's live keys reach a running run at a step boundary, without a restart,
and are recorded as a config revision on the run; other changes wait for new runs."""

import time

import pytest

from apps.experiments.models import Run
from apps.experiments.services import arm_update, run_submit
from apps.telemetry.models import TelemetrySample
from tests.workers.test_runs_on_a_worker import LONG, experiment_with, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_live_key_reaches_the_running_run_and_is_recorded(celery_worker_process):
    exp = experiment_with(LONG.replace("interval_s: 0.2", "interval_s: 1.0"))
    arm = exp.arms.get()
    run = run_submit(experiment=exp)
    wait_for(lambda: TelemetrySample.objects.filter(run=run).count() >= 2, 120, "telemetry")

    edited = arm.strategy_yaml.replace("interval_s: 1.0", "interval_s: 0.1").replace(
        "seed: 1", "seed: 2"
    )
    update = arm_update(arm=arm, strategy_yaml=edited)
    committed = time.monotonic()
    assert update.live_keys == {"telemetry": {"interval_s": 0.1}}
    assert update.new_runs_only == ["train.seed"]

    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, config_revision=2).first(), 30, "the revision"
    )
    took = time.monotonic() - committed
    # bench/hot_reload.py measures the latency (p99: well under a second). Here three xdist
    # workers share two cores with this run (CI saw 6.3 s); a bound near the 1 s poll would flake,
    # so this one only catches a revision that waits for something slow (a restart, a new run).
    assert took < 15.0, f"applied {took:.2f} s after commit"
    (entry,) = run.config_history
    assert entry["revision"] == 2 and entry["live"] == {"telemetry": {"interval_s": 0.1}}
    assert entry["not_applied"] == ["train.seed"]

    # The sampler really runs faster now: about ten samples a second instead of one.
    before = TelemetrySample.objects.filter(run=run).count()
    time.sleep(2.0)
    assert TelemetrySample.objects.filter(run=run).count() - before >= 8
    assert Run.objects.get(pk=run.pk).status == "running"  # no restart
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    wait_for(lambda: Run.objects.filter(pk=run.pk, status="cancelled").exists(), 15, "the cancel")
