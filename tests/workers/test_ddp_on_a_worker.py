"""A DDP run end to end on a real Celery worker: two gloo ranks launched by torch's elastic
launcher from the worker's task, both ranks' telemetry stored, and a bill for two devices."""

from collections import defaultdict

import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from apps.telemetry.models import TelemetrySample
from tests.helpers import wait_for
from tests.workers.test_runs_on_a_worker import experiment_with

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

TWO_RANKS = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 15, global_batch: 4, seed: 1}
telemetry: {interval_s: 0.2}
distributed: {nproc_per_node: 2}
"""


def test_a_two_rank_run_trains_on_a_worker_and_is_billed_for_two_devices(celery_worker_process):
    run = run_submit(experiment=experiment_with(TWO_RANKS), git_sha="beef")
    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
        180,
        "the run to end",
    )
    assert run.status == "succeeded", run.error
    assert run.world_size == 2 and run.device == "cpu x2" and run.vcpus == 2  # one thread per rank
    rows = list(
        TelemetrySample.objects.filter(run=run).order_by("seq").values("seq", "rank", "ts", "step")
    )
    assert [r["seq"] for r in rows] == list(range(len(rows)))  # one seq space, nothing lost
    streams = defaultdict(list)
    for r in rows:
        streams[r["rank"]].append(r)
    assert set(streams) == {0, 1} and all(len(s) >= 2 for s in streams.values())
    # the world's progress once; every device's time
    assert run.steps == 15 and run.tokens == 15 * 4 * 32
    spans = [(s[-1]["ts"] - s[0]["ts"]).total_seconds() for s in streams.values()]
    assert run.device_seconds == pytest.approx(sum(spans), rel=1e-6)
    assert run.device_seconds > 1.5 * max(spans)
    vcpu_hour_usd = 0.04  # the factory's table
    assert run.cost_breakdown["cpu_usd"] == pytest.approx(
        sum(spans) * 1 * vcpu_hour_usd / 3600, rel=1e-6
    )
    assert run.cost_usd > 0 and run.energy_j > 0 and run.energy_estimated
