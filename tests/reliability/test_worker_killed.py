"""A worker killed with SIGKILL mid-run: the run is swept as lost, retried on another
worker, and its cost counts each sample once (never stuck running, never billed twice)."""

import itertools
import os
import signal
import time

import pytest

from apps.billing import cost_engine
from apps.experiments.models import Run
from apps.experiments.runs import runs_sweep_lost
from apps.experiments.services import run_submit
from apps.pricing.selectors import price_schedule
from apps.telemetry.models import TelemetrySample
from tests import pricing_reference
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import start_worker, stop_worker
from tests.workers.test_runs_on_a_worker import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

STRATEGY = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 60, global_batch: 2, seed: 3}
telemetry: {interval_s: 0.2}
"""


def recompute(run):
    """Price every stored sample from scratch, each attempt's counters starting afresh."""
    rows = list(TelemetrySample.objects.filter(run=run).order_by("seq").values())
    prices_at = price_schedule(tenant_id=run.tenant_id, gpu_sku_id=None).at
    weights = cost_engine.Weights.from_cost_model(run.experiment.cost_model)
    usage, cost = cost_engine.Usage.zero(), cost_engine.CostBreakdown.zero()
    for _, group in itertools.groupby(rows, key=lambda r: r["attempt"]):
        u, c = pricing_reference.price_samples(
            list(group), prices_at=prices_at, weights=weights, gpu_count=0, vcpus=run.vcpus
        )
        usage, cost = usage + u, cost + c
    return usage, cost


def test_sigkill_mid_run_is_swept_lost_then_retried_and_billed_once(django_db_setup):
    price = GpuPriceFactory()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=STRATEGY)

    doomed, _ = start_worker(lease_s=2)
    survivor = None
    try:
        run = run_submit(experiment=exp)
        wait_for(
            lambda: TelemetrySample.objects.filter(run=run).count() >= 3,
            120,
            "telemetry from worker A",
        )
        os.killpg(doomed.pid, signal.SIGKILL)  # the worker and its pool child, at once
        doomed.wait(10)
        run.refresh_from_db()
        assert run.status == "running"  # nobody has said otherwise yet: the lease will
        stored_before = TelemetrySample.objects.filter(run=run).count()

        time.sleep(2.5)  # the lease expires
        assert runs_sweep_lost() == [run.pk]
        run.refresh_from_db()
        assert run.status == "queued" and run.attempts == 1 and "lost" in run.error

        survivor, _ = start_worker()
        run = wait_for(
            lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
            120,
            "the retry to finish",
        )
    finally:
        for proc in (doomed, survivor):
            if proc is not None and proc.poll() is None:
                stop_worker(proc)

    assert run.status == "succeeded", run.error
    assert run.attempts == 2
    attempts = set(TelemetrySample.objects.filter(run=run).values_list("attempt", flat=True))
    assert attempts == {1, 2}
    assert TelemetrySample.objects.filter(run=run).count() > stored_before
    usage, cost = recompute(run)
    assert run.tokens == usage.tokens
    assert float(run.cost_usd) == pytest.approx(cost.total_usd, abs=2e-6)
    # The second attempt trained all 60 steps again: that work was really paid for, once.
    assert run.tokens >= 60 * 2 * 32
