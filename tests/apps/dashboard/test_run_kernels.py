"""A run's page diagnoses its kernels from NVML GPM and charts the three GPM series; a run without
GPM (a CPU, a GPU before Hopper) says the diagnosis is unavailable and draws no empty GPM charts."""

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.billing.services import telemetry_ingest
from apps.telemetry.diagnosis import run_kernel_diagnosis
from tests.apps.dashboard.world import run_of

pytestmark = pytest.mark.django_db


def ingest(run, rows: list[tuple[int, float | None, float | None, float | None]]) -> None:
    """rows of (step, tensor %, DRAM %, SM occupancy %), one second apart."""
    start = timezone.now() - timedelta(seconds=60)
    samples = []
    for seq, (step, tensor, dram, occupancy) in enumerate(rows):
        sample = {
            "seq": seq,
            "ts": (start + timedelta(seconds=seq)).isoformat(),
            "step": step,
            "device": "cuda:0 NVIDIA H200",
            "util_pct": 97.0,
            "power_w": 480.0,
            "step_time_s": 0.2,
        }
        for key, value in (
            ("tensor_active_pct", tensor),
            ("dram_bw_pct", dram),
            ("sm_occupancy_pct", occupancy),
        ):
            if value is not None:
                sample[key] = value
        samples.append(sample)
    telemetry_ingest(run_id=run.pk, samples=samples, attempt=run.attempts)


def page(member, run) -> tuple[str, dict]:
    html = member.get(reverse("dashboard:run", args=[run.pk])).content.decode()
    data = json.loads(
        re.search(
            r'<script id="dashboard-data" type="application/json">(.*?)</script>', html, re.S
        ).group(1)
    )
    line = re.search(r'<p id="kernel-diagnosis"[^>]*>(.*?)</p>', html, re.S).group(1)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", line)), data


def test_a_memory_bound_run_is_named_so_with_its_figures_and_the_gpm_charts(member, w):
    run = run_of(w.candidate, status="running", device="cuda:0 NVIDIA H200")
    # the warm-up sample (step 0: the model being built) is left out of the means
    ingest(
        run,
        [(0, 0.0, 2.0, 1.0), (1, 12.0, 80.0, 40.0), (2, 14.0, 84.0, 44.0), (3, 13.0, 82.0, 42.0)],
    )
    line, data = page(member, run)
    assert "Kernels: memory-bound" in line
    assert "tensor pipes active 13 %" in line and "DRAM bandwidth 82 % used" in line
    assert "SM occupancy 42 %" in line and "means of 3 NVML GPM samples" in line
    assert "fuse kernels" in line
    fields = data["telemetry"]["fields"]
    assert {"tensor_active_pct", "dram_bw_pct", "sm_occupancy_pct"} <= set(fields)
    assert fields["dram_bw_pct"]["unit"] == "%"
    tensor = data["telemetry"]["series"]["tensor_active_pct"][str(run.pk)]
    assert max(tensor["hi"]) == 14.0 and min(tensor["lo"]) == 0.0


def test_a_run_without_gpm_says_unavailable_and_charts_no_gpm(member, w):
    run = run_of(w.candidate, status="running", device="cpu")
    ingest(run, [(s, None, None, None) for s in range(5)])
    line, data = page(member, run)
    assert "Kernel diagnosis: unavailable" in line and "no NVML GPM figures" in line
    assert not {"tensor_active_pct", "dram_bw_pct", "sm_occupancy_pct"} & set(
        data["telemetry"]["fields"]
    )


def test_launch_bound_and_compute_bound_runs(w):
    launch = run_of(w.candidate, status="running")
    ingest(launch, [(s, 8.0, 15.0, None) for s in range(1, 5)])
    compute = run_of(w.candidate, status="running")
    ingest(compute, [(s, 65.0, 40.0, 55.0) for s in range(1, 5)])
    got = run_kernel_diagnosis(run=launch)
    assert got.verdict == "launch_or_input_bound" and got.samples == 4
    assert got.sm_occupancy_pct is None  # not sent: not made up
    assert run_kernel_diagnosis(run=compute).verdict == "compute_bound"


def test_a_packed_run_is_diagnosed_from_the_means_stored_as_it_was_packed(
    w, django_assert_num_queries
):
    from apps.experiments.models import Run
    from apps.telemetry.compaction import run_compact

    run = run_of(w.candidate, status="running", device="cuda:0 NVIDIA H200")
    ingest(
        run, [(0, 0.0, 2.0, 1.0)] + [(s, 12.0 + s % 3, 80.0 + s % 5, 40.0) for s in range(1, 40)]
    )
    before = run_kernel_diagnosis(run=run)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, finished_at=timezone.now())
    assert run_compact(run_id=run.pk) == 40
    run.refresh_from_db()
    assert run.packed_at is not None and run.kernel_means["n"] == 39
    with django_assert_num_queries(0):  # four stored numbers: no sample unpacked, none read
        after = run_kernel_diagnosis(run=run)
    assert after == before and after.verdict == "memory_bound"
    # A run packed before the means were kept: its samples are read back for the diagnosis.
    Run.objects.filter(pk=run.pk).update(kernel_means=None)
    run.refresh_from_db()
    assert run_kernel_diagnosis(run=run) == before
