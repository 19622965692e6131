"""A run's kernel diagnosis: gpu_runtime.diagnosis's rule on the means of its stored GPM samples.

The means come from one query over the raw samples; compaction stores them on the run
(Run.kernel_means) as it packs them, so a packed run's page reads four numbers instead of
unpacking every sample (about 8 us a sample, on every view), and the diagnosis outlives retention.
"""

from __future__ import annotations

from django.db.models import Avg, Count, Q

from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from gpu_runtime.diagnosis import KernelDiagnosis, kernel_verdict


def gpm_means(*, run: Run) -> dict[str, float | int | None]:
    """n, tensor, dram and occupancy: the means over the run's raw samples after its first step
    that carry tensor activity and DRAM bandwidth (one query)."""
    return (
        TelemetrySample.objects.of_run(run)
        .filter(step__gte=1, tensor_active_pct__isnull=False, dram_bw_pct__isnull=False)
        .aggregate(
            n=Count("seq"),
            tensor=Avg("tensor_active_pct"),
            dram=Avg("dram_bw_pct"),
            occupancy=Avg("sm_occupancy_pct", filter=Q(sm_occupancy_pct__isnull=False)),
        )
    )


def run_kernel_diagnosis(*, run: Run) -> KernelDiagnosis:
    """Memory-, launch/input- or compute-bound, or unavailable (no GPM figures): from the means
    stored at compaction, else one query over the run's samples (a run packed before the means
    were stored has its samples read back as raw ones for it)."""
    means = run.kernel_means
    if means is None:
        from apps.telemetry.compaction import rehydrated

        with rehydrated([run]):
            means = gpm_means(run=run)
    return kernel_verdict(
        tensor_active_pct=means["tensor"],
        dram_bw_pct=means["dram"],
        sm_occupancy_pct=means["occupancy"],
        samples=means["n"],
    )
