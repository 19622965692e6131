"""A run's kernel diagnosis: gpu_runtime.diagnosis's rule on the means of its stored GPM samples."""

from __future__ import annotations

from django.db.models import Avg, Count, Q

from apps.experiments.models import Run
from apps.telemetry.compaction import rehydrated
from apps.telemetry.models import TelemetrySample
from gpu_runtime.diagnosis import KernelDiagnosis, kernel_verdict


def run_kernel_diagnosis(*, run: Run) -> KernelDiagnosis:
    """Memory-, launch/input- or compute-bound, or unavailable (no GPM figures): one query over
    the run's samples after its first step that carry tensor activity and DRAM bandwidth (a
    packed run's read as raw ones)."""
    with rehydrated([run]):
        rows = (
            TelemetrySample.objects.of_run(run)
            .filter(step__gte=1, tensor_active_pct__isnull=False, dram_bw_pct__isnull=False)
            .aggregate(
                n=Count("seq"),
                tensor=Avg("tensor_active_pct"),
                dram=Avg("dram_bw_pct"),
                occupancy=Avg("sm_occupancy_pct", filter=Q(sm_occupancy_pct__isnull=False)),
            )
        )
    return kernel_verdict(
        tensor_active_pct=rows["tensor"],
        dram_bw_pct=rows["dram"],
        sm_occupancy_pct=rows["occupancy"],
        samples=rows["n"],
    )
