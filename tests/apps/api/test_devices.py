"""Device profiles recorded, listed, and read at authoring: a dtype emulated on every device of
a queue is warned about by key, one that none can run is refused before anything is queued."""

from __future__ import annotations

import copy

import pytest

from apps.devices.models import Device, DeviceMeasurement
from apps.devices.services import device_profile_record
from apps.experiments.models import Run
from tests.apps.api.conftest import GOOD, error
from tests.factories import XEON_AMX, device_profile

pytestmark = pytest.mark.django_db

BF16 = GOOD + "precision: {compute_dtype: bf16}\n"
AUTO = GOOD + "precision: {compute_dtype: auto}\n"


def record(cpu=None, *, host="worker-1", queues=("cpu",), profile=None):
    return device_profile_record(
        host=host,
        label="cpu",
        queues=list(queues),
        profile=profile or (device_profile(host=host) if cpu is None else device_profile(cpu)),
    )


def test_every_measurement_is_kept_and_the_device_points_at_its_latest():
    first = record()
    second = record(XEON_AMX)
    assert first.pk == second.pk and Device.objects.count() == 1
    assert DeviceMeasurement.objects.filter(device=second).count() == 2
    second.refresh_from_db()
    assert second.latest.best_dtype == "bf16" and "amx_bf16" in second.device_class


def test_a_failed_measurement_is_recorded_and_the_last_good_profile_stands():
    good = record()
    failed = device_profile_record(
        host="worker-1", label="cpu", queues=["cpu"], profile=None, error="CUDA error: boom"
    )
    failed.refresh_from_db()
    assert failed.error == "CUDA error: boom" and failed.latest_id == good.latest_id


def test_validating_bf16_on_a_queue_that_emulates_it_warns_naming_the_key(api):
    record()
    response = api.post("/api/v1/arms/validate/", {"strategy_yaml": BF16}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["valid"] is True
    [warning] = body["warnings"]
    assert warning["key"] == "precision.compute_dtype" and warning["queue"] == "cpu"
    assert warning["message"].startswith("precision.compute_dtype: bf16 runs at 0.02x fp32")
    assert "no avx512_bf16/amx" in warning["message"] and "expect it dearer" in warning["message"]
    assert warning["ratio"] == pytest.approx(0.02)


def test_no_warning_where_the_device_runs_bf16_natively_or_for_auto(api):
    record(XEON_AMX)
    bf16 = api.post("/api/v1/arms/validate/", {"strategy_yaml": BF16}, format="json").json()
    assert bf16["warnings"] == []
    record(host="worker-2")  # an AVX2 host too: bf16 is not dear on *every* device
    bf16 = api.post("/api/v1/arms/validate/", {"strategy_yaml": BF16}, format="json").json()
    assert bf16["warnings"] == [], "one of the queue's devices runs bf16 natively"
    auto = api.post("/api/v1/arms/validate/", {"strategy_yaml": AUTO}, format="json").json()
    assert auto["warnings"] == []


def test_another_queue_is_checked_against_its_own_devices(api):
    record()  # the cpu queue only
    gpu = api.post(
        "/api/v1/arms/validate/", {"strategy_yaml": BF16, "queue": "gpu"}, format="json"
    ).json()
    assert gpu["warnings"] == []  # the gpu queue has seen no device: nothing to say
    bad = api.post("/api/v1/arms/validate/", {"strategy_yaml": BF16, "queue": "tpu"}, format="json")
    assert bad.status_code == 400 and "queue" in error(bad)["message"]


def test_arm_writes_answer_the_warnings_too(api, experiment):
    record()
    created = api.post(
        "/api/v1/arms/",
        {"experiment": experiment.pk, "name": "bf16", "strategy_yaml": BF16},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert [w["key"] for w in created.json()["warnings"]] == ["precision.compute_dtype"]
    edited = api.patch(
        f"/api/v1/arms/{created.json()['id']}/", {"strategy_yaml": GOOD}, format="json"
    )
    assert edited.status_code == 200 and edited.json()["warnings"] == []


def _no_bf16_kernel() -> dict:
    profile = device_profile()
    broken = copy.deepcopy(profile)
    broken["dtypes"]["bf16"].update(gflops=None, ratio_vs_fp32=None, error="no kernel: bf16")
    return broken


def test_a_dtype_no_device_of_the_queue_can_run_is_refused_before_anything_is_queued(
    api, experiment
):
    record(profile=_no_bf16_kernel())
    response = api.post("/api/v1/arms/validate/", {"strategy_yaml": BF16}, format="json")
    assert response.status_code == 400
    body = error(response)
    assert "precision.compute_dtype" in body["message"] and "cannot run" in body["message"]
    arm = experiment.arms.get(name="candidate")
    arm.strategy_yaml = BF16
    arm.save()
    submitted = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "arm": arm.pk}, format="json"
    )
    assert submitted.status_code == 400, submitted.content
    assert "precision.compute_dtype" in error(submitted)["message"]
    assert not Run.objects.filter(arm=arm).exists()


def test_devices_are_listed_with_their_profiles(api):
    record()
    response = api.get("/api/v1/devices/")
    assert response.status_code == 200
    body = response.json()
    rows = body["results"] if isinstance(body, dict) else body
    [row] = rows
    assert row["host"] == "worker-1" and row["queues"] == ["cpu"]
    assert row["latest"]["best_dtype"] == "fp32"
    assert row["latest"]["profile"]["dtypes"]["bf16"]["native"] is False
    assert row["device_class_label"] == "AMD EPYC 7B13 (avx2)"


def test_only_staff_ask_for_a_new_measurement_and_the_queue_is_named(api, staff):
    assert api.post("/api/v1/devices/measure/", {"queue": "cpu"}, format="json").status_code == 403
    bad = staff.post("/api/v1/devices/measure/", {"queue": "tpu"}, format="json")
    assert bad.status_code == 400 and "queue" in error(bad)["message"]
    ok = staff.post("/api/v1/devices/measure/", {"queue": "cpu"}, format="json")
    assert ok.status_code == 202 and ok.json()["queue"] == "cpu"
