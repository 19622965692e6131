"""The GPM means a run's kernel diagnosis reads, from its raw samples (one query).

Its own module: compaction stores them as it packs a run (Run.kernel_means), and the diagnosis
(apps.telemetry.diagnosis) reads a packed run's samples back through compaction, so neither
imports the other's module in a cycle.
"""

from __future__ import annotations

from django.db.models import Avg, Count, Q

from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample


def gpm_means(*, run: Run) -> dict[str, float | int | None]:
    """n, tensor, dram and occupancy: the means over the run's raw samples after its first step
    that carry tensor activity and DRAM bandwidth."""
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
