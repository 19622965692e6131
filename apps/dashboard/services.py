"""Writes of the dashboard: rolling settled telemetry up into SeriesBlocks (its read model).

Blocks are built on beat (`series_blocks_roll_due`, every COSTLAB_SERIES_ROLLUP_S), never on a page
view: a GET reads the blocks there are and the raw samples after them (apps.dashboard.series).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection
from django.db.models import F, Q

from apps.dashboard.models import CHART_FIELDS, SeriesBlock
from apps.dashboard.series import last_block
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from apps.telemetry.rollup import window_sql


def _rollup_sql(ranges: int, within: str) -> str:
    block, stats = SeriesBlock.SEQS, []
    for f in CHART_FIELDS:  # names come from CHART_FIELDS, never from a caller
        stats.append(f"MIN(s.{f}), MAX(s.{f}), SUM(s.{f}), COUNT(s.{f})")
    columns = ", ".join(f"{f}_min, {f}_max, {f}_sum, {f}_n" for f in CHART_FIELDS)
    values = ", ".join(["(CAST(%s AS BIGINT), CAST(%s AS BIGINT), CAST(%s AS BIGINT))"] * ranges)
    # The WHERE keeps SQLite's parser from reading ON CONFLICT as a join's ON clause.
    return (
        f"WITH w(run_id, lo, hi) AS (VALUES {values}) INSERT INTO {SeriesBlock._meta.db_table} "
        f"(run_id, block, samples, ts_first, ts_last, estimated, {columns}) SELECT s.run_id, "
        f"s.seq / {block}, COUNT(*), MIN(s.ts), MAX(s.ts), MAX(CASE WHEN s.estimated THEN 1 ELSE "
        f"0 END) = 1, {', '.join(stats)} FROM {TelemetrySample._meta.db_table} s JOIN w ON "
        f"s.run_id = w.run_id WHERE {within} AND s.seq >= w.lo AND s.seq < w.hi GROUP BY "
        "s.run_id, s.seq / "
        f"{block} ON CONFLICT (run_id, block) DO NOTHING"
    )


def series_blocks_refresh(*, runs: Iterable[Run], whole: bool = False) -> dict[int, int]:
    """Roll up every block of these runs whose samples are all settled; per run, the first seq not
    rolled up.

    Incremental: only blocks after the run's last one are read, so a training run adds a block or
    two per call. Idempotent (ON CONFLICT DO NOTHING): concurrent calls are harmless.
    Two queries when nothing is new, three otherwise.
    whole: a finished run's last block is rolled up too, however few samples it holds (before
    retention drops the samples, apps.ops.telemetry_upkeep).
    """
    runs = list(runs)
    if not runs:
        return {}
    done = {
        pk: block
        for pk, block in Run.objects.filter(pk__in=[r.pk for r in runs])
        .annotate(last=last_block())
        .values_list("pk", "last")
        if block is not None
    }
    upto, ranges = {}, []
    for run in runs:
        start = (done[run.pk] + 1) * SeriesBlock.SEQS if run.pk in done else 0
        settled = (
            (run.priced_seq + 1) // SeriesBlock.SEQS * SeriesBlock.SEQS
        )  # whole blocks at or below priced_seq
        if whole and run.status not in Run.ACTIVE_STATUSES and run.priced_seq == run.last_seq:
            settled = run.last_seq + 1
        upto[run.pk] = max(start, settled)
        if settled > start:
            ranges.append((run.pk, start, settled))
    if ranges:
        # Inside the stored spans of the runs rolled: Postgres reads only those days' partitions.
        rolled = [r for r in runs if r.pk in {pk for pk, _, _ in ranges}]
        within, span = window_sql(
            min((r.samples_from for r in rolled if r.samples_from), default=None),
            max((r.samples_to for r in rolled if r.samples_to), default=None),
            "s",
        )
        with connection.cursor() as cursor:
            cursor.execute(_rollup_sql(len(ranges), within), [v for r in ranges for v in r] + span)
    return upto


def series_blocks_roll_due(*, limit: int = 500) -> int:
    """Beat: roll up the runs with a whole settled block past their last one, and the last block
    of each finished run; how many runs were rolled.

    One query finds them (the last block of each run read backwards from the (run, block) index),
    the newest first; `limit` bounds one call's work, the next call takes the rest.
    """
    seqs = SeriesBlock.SEQS
    due = list(
        Run.objects.filter(priced_seq__gte=seqs - 1)
        .annotate(last=last_block())
        .filter(Q(last__isnull=True) | Q(priced_seq__gte=(F("last") + 2) * seqs - 1))
        .order_by("-updated_at")
        .only("pk", "priced_seq", "samples_from", "samples_to")[:limit]
    )
    series_blocks_refresh(runs=due)
    # A finished, settled run's last few samples (under a block) are rolled up too: its chart is
    # then read from blocks alone, the same before and after retention drops its samples.
    ended = list(
        Run.objects.exclude(status__in=Run.ACTIVE_STATUSES)
        .filter(last_seq__gte=0, priced_seq=F("last_seq"))
        .annotate(last=last_block())
        .filter(Q(last__isnull=True) | Q(last_seq__gte=(F("last") + 1) * seqs))
        .order_by("-updated_at")
        .only("pk", "status", "priced_seq", "last_seq", "samples_from", "samples_to")[:limit]
    )
    series_blocks_refresh(runs=ended, whole=True)
    return len(due) + len(ended)
