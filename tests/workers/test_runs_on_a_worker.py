"""End to end with a real Celery worker process: a submitted run trains, streams telemetry,
gets a cost; a cancelled run stops within about two seconds and keeps what it measured."""

import time

import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_cancel, run_submit
from apps.telemetry.models import TelemetrySample
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import wait_for  # noqa: F401  (other modules import it from here too)

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 20, global_batch: 2, seed: 1}
telemetry: {interval_s: 0.2}
"""
LONG = SHORT.replace("steps: 20", "steps: 100000")


def experiment_with(strategy):
    price = GpuPriceFactory()  # a pricing table for the tenant; CPU runs pay vCPU-hours and energy
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=strategy)
    return exp


def test_a_submitted_run_trains_and_ends_with_telemetry_and_a_cost(celery_worker_process):
    run = run_submit(experiment=experiment_with(SHORT), git_sha="deadbeef")
    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
        120,
        "the run to end",
    )
    assert run.status == "succeeded", run.error
    seqs = list(
        TelemetrySample.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs and seqs == list(range(len(seqs)))
    assert run.priced_seq == seqs[-1]
    assert run.steps == 20 and run.tokens == 20 * 2 * 32
    assert run.cost_usd > 0 and run.energy_j > 0
    assert run.energy_estimated  # no RAPL/NVML here: modelled power, flagged
    assert run.device == "cpu" and run.host and run.dataset_sha256 and run.git_sha == "deadbeef"
    assert run.attempts == 1 and not run.lease_owner


def test_a_worker_profiles_its_device_and_an_auto_run_records_what_it_resolved_to(
    celery_worker_process,
):
    import torch

    from apps.devices.models import Device
    from gpu_runtime import load_strategy
    from gpu_runtime.device_keys import resolve_device_keys
    from gpu_runtime.profile import FLOAT_DTYPES, DeviceProfile, best_dtype

    auto = SHORT.replace(
        "train:",
        "precision: {compute_dtype: auto}\nkernels: {compile: auto, attention: auto}\ntrain:",
    )
    run = run_submit(experiment=experiment_with(auto))
    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(),
        120,
        "the run to end",
    )
    assert run.status == "succeeded", run.error
    device = Device.objects.get(host=run.host, label="cpu")
    assert device.queues and "cpu" in device.queues and device.latest is not None
    assert run.device_measurement is not None and run.device_measurement.device == device
    profile = DeviceProfile.from_dict(run.device_measurement.profile)
    assert run.device_class == profile.device_class and run.device_class.startswith("cpu:")
    # Whichever float dtype this CPU measured fastest and runs natively: fp16 too, on one with
    # avx512_fp16 (an AMX Xeon's bf16 and fp16 GEMMs come within noise of each other).
    assert run.compute_dtype == best_dtype(profile) and run.compute_dtype in FLOAT_DTYPES
    assert run.compute_dtype == "fp32" or profile.dtypes[run.compute_dtype].native
    # what each auto key became, stored as training started: the runtime's answer on that profile
    _, reports = resolve_device_keys(load_strategy(auto), torch.device("cpu"), profile)
    compiled = run.resolved.pop("kernels.compile")  # decided while training: how it ended
    assert run.resolved == {
        key: {"requested": "auto", "resolved": r["resolved"], "why": r["why"]}
        for key, r in reports.items()
        if key != "kernels.compile"
    }
    assert compiled["requested"] == "auto" and compiled["mode"] == "eager"  # a short run
    assert compiled["resolved"] is False and compiled["why"]
    assert run.resolved["precision.compute_dtype"]["resolved"] == run.compute_dtype
    assert run.resolved["kernels.attention"]["resolved"] == "math"


def test_a_training_worker_profiles_its_devices_as_it_starts(transactional_db):
    from apps.devices.models import Device
    from tests.helpers import start_worker, stop_worker

    proc, _name = start_worker(queues="cpu", COSTLAB_DEVICE_PROFILE_AT_START="true")
    try:
        device = wait_for(
            lambda: Device.objects.filter(label="cpu", latest__isnull=False).first(),
            60,
            "the worker's device profile",
        )
        # and again on demand (the API's POST /api/v1/devices/measure/ sends this)
        from apps.devices.services import devices_profile_request

        assert devices_profile_request(queue="cpu")
        wait_for(lambda: device.measurements.count() >= 2, 60, "a second measurement")
    finally:
        stop_worker(proc)
    assert device.queues == ["cpu"] and device.device_class.startswith("cpu:")
    assert set(device.latest.profile["dtypes"]) >= {"fp32", "bf16", "fp16"}
    assert device.latest.best_dtype in ("fp32", "bf16", "fp16")


def test_a_cancelled_run_stops_at_a_step_boundary_and_keeps_its_telemetry(celery_worker_process):
    run = run_submit(experiment=experiment_with(LONG))
    wait_for(
        lambda: TelemetrySample.objects.filter(run=run).count() >= 3, 120, "telemetry to arrive"
    )
    asked = time.monotonic()
    run_cancel(run=run)
    wait_for(lambda: Run.objects.filter(pk=run.pk, status="cancelled").exists(), 10, "the cancel")
    took = time.monotonic() - asked
    run.refresh_from_db()
    assert took < 4.0, f"cancel took {took:.2f} s"  # about 1 s when the machine is quiet
    assert run.finished_at and run.steps > 0 and run.cost_usd > 0
    assert TelemetrySample.objects.filter(run=run).count() >= 3
