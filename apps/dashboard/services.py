"""Writes of the dashboard: rolling settled telemetry up into SeriesBlocks (its read model)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection
from django.db.models import OuterRef, Subquery

from apps.dashboard.models import CHART_FIELDS, SeriesBlock
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample


def _rollup_sql(ranges: int) -> str:
    block, stats = SeriesBlock.SEQS, []
    for f in CHART_FIELDS:  # names come from CHART_FIELDS, never from a caller
        stats.append(f"MIN(s.{f}), MAX(s.{f}), SUM(s.{f}), COUNT(s.{f})")
    columns = ", ".join(f"{f}_min, {f}_max, {f}_sum, {f}_n" for f in CHART_FIELDS)
    values = ", ".join(["(CAST(%s AS BIGINT), CAST(%s AS BIGINT), CAST(%s AS BIGINT))"] * ranges)
    # The WHERE keeps SQLite's parser from reading ON CONFLICT as a join's ON clause.
    return (
        f"WITH w(run_id, lo, hi) AS (VALUES {values}) "
        f"INSERT INTO {SeriesBlock._meta.db_table} (run_id, block, samples, ts_first, ts_last, estimated, {columns}) "
        f"SELECT s.run_id, s.seq / {block}, COUNT(*), MIN(s.ts), MAX(s.ts), "
        f"MAX(CASE WHEN s.estimated THEN 1 ELSE 0 END) = 1, {', '.join(stats)} "
        f"FROM {TelemetrySample._meta.db_table} s JOIN w ON s.run_id = w.run_id "
        f"WHERE s.seq >= w.lo AND s.seq < w.hi GROUP BY s.run_id, s.seq / {block} "
        "ON CONFLICT (run_id, block) DO NOTHING"
    )


def series_blocks_refresh(*, runs: Iterable[Run]) -> dict[int, int]:
    """Roll up every block of these runs whose samples are all settled; per run, the first seq not rolled up.

    Incremental: only blocks after the run's last one are read, so a page view of a training
    run adds a block or two. Idempotent (ON CONFLICT DO NOTHING): concurrent views are harmless.
    Two queries when nothing is new, three otherwise.
    """
    runs = list(runs)
    if not runs:
        return {}
    # The last block of each run, read backwards from the (run, block) index: no scan of the blocks.
    last = SeriesBlock.objects.filter(run_id=OuterRef("pk")).order_by("-block").values("block")[:1]
    done = {pk: block for pk, block in Run.objects.filter(pk__in=[r.pk for r in runs])
            .annotate(last=Subquery(last)).values_list("pk", "last") if block is not None}
    upto, ranges = {}, []
    for run in runs:
        start = (done[run.pk] + 1) * SeriesBlock.SEQS if run.pk in done else 0
        settled = (run.priced_seq + 1) // SeriesBlock.SEQS * SeriesBlock.SEQS  # whole blocks at or below priced_seq
        upto[run.pk] = max(start, settled)
        if settled > start:
            ranges.append((run.pk, start, settled))
    if ranges:
        with connection.cursor() as cursor:
            cursor.execute(_rollup_sql(len(ranges)), [v for r in ranges for v in r])
    return upto
