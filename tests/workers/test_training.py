"""The worker, in this process (no Celery): what a run's `auto` keys become on the device is stored
on the run and logged before training starts."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from apps.devices.services import device_profile_record
from apps.experiments.models import Run
from apps.experiments.services import run_submit
from gpu_runtime import load_strategy
from gpu_runtime.device_keys import resolve_device_keys
from gpu_runtime.profile import DeviceProfile
from tests.factories import XEON_AMX, ArmFactory, ExperimentFactory, GpuPriceFactory, device_profile
from workers import training

pytestmark = pytest.mark.django_db

# The demo's optimized arm (apps.demo.services) on a host whose bf16 GEMMs are flat from 256 rows:
# one sequence of 256 tokens. Both kernel keys auto too.
STRATEGY = """\
model: {preset: tiny, seq_len: 256}
data: {source: synthetic}
train: {steps: 30, global_batch: 8, micro_batch: 1}
precision: {compute_dtype: auto}
kernels: {compile: auto, attention: auto}
optimizer:
  dynamic_batching: {enabled: true, min_micro_batch: 1, max_micro_batch: auto, probe_steps: 1}
"""
FLAT_BF16 = [[64, 60.0], [128, 150.0], [256, 215.0], [512, 225.0], [1024, 230.0], [2048, 231.0]]
CEILING = "optimizer.dynamic_batching.max_micro_batch"


def test_the_worker_stores_and_logs_what_auto_became_before_training(monkeypatch, caplog):
    profile = {
        **device_profile(XEON_AMX),
        "rows_gflops": {"bf16": FLAT_BF16},
        "rows_kn": [256, 768],
    }
    measurement = device_profile_record(
        host="worker-1", label="cpu", queues=["cpu"], profile=profile
    ).latest
    monkeypatch.setattr(training, "run_profile", lambda **_: measurement)
    exp = ExperimentFactory(tenant=GpuPriceFactory().pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=STRATEGY)
    run = run_submit(experiment=exp)
    stopped = threading.Event()
    stopped.set()  # hands the run back after recording its device, before it trains
    with caplog.at_level(logging.INFO, logger="workers.training"):
        training._run_execute(run.pk, stopped)

    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.device_measurement == measurement
    _, reports = resolve_device_keys(
        load_strategy(STRATEGY), torch.device("cpu"), DeviceProfile.from_dict(profile)
    )
    assert run.resolved == {
        key: {"requested": "auto", "resolved": r["resolved"], "why": r["why"]}
        for key, r in reports.items()
    }
    assert set(run.resolved) == {
        "precision.compute_dtype",
        "kernels.compile",
        "kernels.attention",
        CEILING,
    }
    assert run.compute_dtype == run.resolved["precision.compute_dtype"]["resolved"] == "bf16"
    why = (
        "bf16 GEMMs reach 90% of their best throughput at 256 rows (1 sequence of 256 tokens); "
        "a larger micro-batch buys under 10% here"
    )
    assert run.resolved[CEILING] == {"requested": "auto", "resolved": 1, "why": why}
    logged = [r.getMessage() for r in caplog.records if r.name == "workers.training"]
    assert f"run {run.pk}: {CEILING} auto → 1: {why}" in logged
    assert (
        f"run {run.pk}: kernels.compile auto → false: " + (run.resolved["kernels.compile"]["why"])
        in logged
    )


@pytest.mark.django_db(transaction=True)
def test_the_run_ends_with_how_kernels_compile_ended(monkeypatch):
    """compile: auto decides while training; the worker stores the outcome over the start's
    "decided in the run", so the run page and the API say eager (or compiled, and in how long)."""
    monkeypatch.setattr(training, "run_profile", lambda **_: None)
    exp = ExperimentFactory(tenant=GpuPriceFactory().pricing_table.tenant, status="active")
    ArmFactory(
        experiment=exp,
        name="control",
        is_control=True,
        strategy_yaml=(
            "model: {preset: tiny, seq_len: 16}\ndata: {source: synthetic}\n"
            "train: {steps: 5, global_batch: 2}\nkernels: {compile: auto}\n"
            "telemetry: {interval_s: 0.05}\n"
        ),
    )
    run = run_submit(experiment=exp)
    training._run_execute(run.pk, threading.Event())
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    compiled = run.resolved["kernels.compile"]
    assert compiled["requested"] == "auto" and compiled["resolved"] is False
    assert compiled["mode"] == "eager" and compiled["decided_at_step"] in (0, 3)
    assert compiled["why"].startswith("compiling does not pay: ")
    assert compiled["expected_saving_s"] < compiled["expected_cost_s"]
