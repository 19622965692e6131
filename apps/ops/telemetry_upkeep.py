"""Telemetry upkeep on beat: partitions made ready ahead, stray rows moved into their own, then
retention, which drops raw samples older than COSTLAB_TELEMETRY_RETENTION_DAYS a partition at a
time (apps.telemetry.partitions) once the charts' blocks hold every sample of the runs concerned.

What stays for good: every run's bill and totals (kept on the run as telemetry lands), its
comparisons and CSV exports (read from those totals and the attribution windows), and its charts
(the dashboard's SeriesBlocks, each the min/max/mean of 64 consecutive samples).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings

from apps.dashboard.services import series_blocks_refresh
from apps.experiments.models import Run
from apps.telemetry.partitions import partitions_drop_before, partitions_maintain


@dataclass
class Upkeep:
    created: list[str]
    moved_rows: int
    dropped: list[str]
    kept: dict[str, list[int]]
    runs_marked: int

    def as_dict(self) -> dict:
        return asdict(self)


def _roll_whole(run_ids: list[int]) -> None:
    series_blocks_refresh(runs=Run.objects.filter(pk__in=run_ids), whole=True)


def telemetry_upkeep(*, now: datetime | None = None) -> Upkeep:
    now = now or datetime.now(UTC)
    made = partitions_maintain(now=now)
    days = settings.COSTLAB_TELEMETRY_RETENTION_DAYS
    gone = (
        partitions_drop_before(cutoff=now - timedelta(days=days), before_drop=_roll_whole)
        if days > 0
        else None
    )
    return Upkeep(
        created=made.created,
        moved_rows=made.moved_rows,
        dropped=gone.dropped if gone else [],
        kept=gone.kept if gone else {},
        runs_marked=gone.runs_marked if gone else 0,
    )
