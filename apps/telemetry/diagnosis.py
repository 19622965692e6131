"""A run's kernel diagnosis: gpu_runtime.diagnosis's rule on the means of its stored GPM samples.

The means come from one query over the raw samples; compaction stores them on the run
(Run.kernel_means) as it packs them, so a packed run's page reads four numbers instead of
unpacking every sample (about 8 us a sample, on every view), and the diagnosis outlives retention.
"""

from __future__ import annotations

from apps.experiments.models import Run
from apps.telemetry.compaction import rehydrated
from apps.telemetry.gpm_means import gpm_means
from gpu_runtime.diagnosis import KernelDiagnosis, kernel_verdict


def run_kernel_diagnosis(*, run: Run) -> KernelDiagnosis:
    """Memory-, launch/input- or compute-bound, or unavailable (no GPM figures): from the means
    stored at compaction, else one query over the run's samples (a run packed before the means
    were stored has its samples read back as raw ones for it)."""
    means = run.kernel_means
    if means is None:
        with rehydrated([run]):
            means = gpm_means(run=run)
    return kernel_verdict(
        tensor_active_pct=means["tensor"],
        dram_bw_pct=means["dram"],
        sm_occupancy_pct=means["occupancy"],
        samples=means["n"],
    )
