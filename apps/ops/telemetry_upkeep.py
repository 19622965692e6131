"""Telemetry upkeep on beat: partitions made ready ahead, stray rows moved into their own,
settled runs' samples packed (apps.telemetry.compaction), then retention, which drops raw and
packed samples older than COSTLAB_TELEMETRY_RETENTION_DAYS a partition at a time
(apps.telemetry.partitions) once the charts' blocks hold every sample of the runs concerned.

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
from apps.telemetry.compaction import run_compact, runs_compactable
from apps.telemetry.partitions import (
    is_partitioned,
    partitions_drop_before,
    partitions_maintain,
)


@dataclass
class Upkeep:
    created: list[str]
    moved_rows: int
    dropped: list[str]
    kept: dict[str, list[int]]
    runs_marked: int
    runs_packed: int = 0
    samples_packed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _roll_whole(run_ids: list[int]) -> None:
    series_blocks_refresh(runs=Run.objects.filter(pk__in=run_ids), whole=True)


def telemetry_upkeep(*, now: datetime | None = None, compact_limit: int = 200) -> Upkeep:
    now = now or datetime.now(UTC)
    made = partitions_maintain(now=now)
    # Compaction: settled runs' charts completed, then their samples packed (a run at a time).
    # Not on SQLite, which keeps its one table.
    settled = runs_compactable(limit=compact_limit) if is_partitioned() else []
    if settled:
        _roll_whole(settled)
    packed = [run_compact(run_id=pk) for pk in settled]
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
        runs_packed=sum(1 for n in packed if n),
        samples_packed=sum(packed),
    )
