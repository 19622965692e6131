"""Reads of telemetry: series downsampled in SQL to a point budget, for charts and the API."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection
from django.db.models import Count, Max
from django.utils.dateparse import parse_datetime

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.telemetry.compaction import rehydrated
from apps.telemetry.models import TelemetrySample

# Numeric columns a chart may ask for, with the unit they are in.
SERIES_UNITS: dict[str, str] = {
    "util_pct": "%",
    "mem_used_mb": "MB",
    "mem_total_mb": "MB",
    "power_w": "W",
    "energy_j": "J",
    "step_time_s": "s",
    "tokens": "tokens",
    "tokens_per_s": "tokens/s",
    "micro_batch": "samples",
    "loss": "",
    "overlap_ratio": "ratio",
    "mfu": "ratio",
    "sm_clock_mhz": "MHz",
    "temperature_c": "°C",
    "sm_occupancy_pct": "%",
    "tensor_active_pct": "%",
    "dram_bw_pct": "%",
    "step": "steps",
}


@dataclass
class Downsampled:
    """series[run_id][field] = [(ts, value), ...] in seq order, at most `budget` points each."""

    budget: int
    series: dict[int, dict[str, list[tuple[datetime, float]]]]
    samples: dict[int, int] = field(default_factory=dict)  # stored samples per run in the window
    estimated: dict[int, bool] = field(
        default_factory=dict
    )  # any power/energy modelled, not measured


def _aware(value) -> datetime:
    if isinstance(value, str):
        value = parse_datetime(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def samples_downsampled(
    *,
    run_ids: list[int] | None = None,
    runs: list[Run] | None = None,
    fields: list[str],
    budget: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Downsampled:
    """Min/max per bucket: each run's samples are cut into budget/2 equal-count buckets (by seq) and
    each bucket keeps its lowest and highest value of each field, so peaks survive and a series has
    at most `budget` points. A series that already fits is returned whole. One query for all runs
    and fields, on Postgres and SQLite alike (two given run_ids, not the runs: their stored spans
    are read first)."""
    unknown = [f for f in fields if f not in SERIES_UNITS]
    if unknown:
        raise ApplicationError(
            f"fields: '{unknown[0]}' is not a telemetry series; choose from "
            f"{', '.join(SERIES_UNITS)}",
            {"fields": {"fields": [f"unknown: {unknown[0]}"]}},
            code="invalid",
        )
    if budget < 2:
        raise ApplicationError(
            "budget: at least 2 points", {"fields": {"budget": ["at least 2"]}}, code="invalid"
        )
    if runs is not None:
        run_ids = [r.pk for r in runs]
    run_ids = sorted({int(r) for r in run_ids or []})
    fields = list(dict.fromkeys(fields))
    result = Downsampled(budget=budget, series={r: {f: [] for f in fields} for r in run_ids})
    if not run_ids or not fields:
        return result

    table = TelemetrySample._meta.db_table
    where, params = [f"run_id IN ({', '.join(['%s'] * len(run_ids))})"], list(run_ids)
    # Inside the runs' stored spans: Postgres reads only the partitions of those days. (A run
    # with samples but no span, its rows written around ingest, leaves the bounds open.)
    if runs is None:  # one query; given the runs, none
        fields_needed = ("pk", "samples_from", "samples_to", "last_seq", "packed_at")
        runs = list(Run.objects.filter(pk__in=run_ids).only(*fields_needed))
    known = [r for r in runs if r.samples_from is not None]
    spans = {
        "lo": min((r.samples_from for r in known), default=None),
        "hi": max((r.samples_to for r in known), default=None),
        "unknown": sum(1 for r in runs if r.samples_from is None and r.last_seq >= 0),
    }
    if not spans["unknown"] and spans["lo"] is not None:
        since = spans["lo"] if since is None else max(since, spans["lo"])
        where.append("ts <= %s")
        params.append(connection.ops.adapt_datetimefield_value(spans["hi"]))
    if since is not None:
        where.append("ts >= %s")
        params.append(connection.ops.adapt_datetimefield_value(since))
    if until is not None:
        where.append("ts < %s")
        params.append(connection.ops.adapt_datetimefield_value(until))
    sql = [
        f"WITH base AS (SELECT run_id, seq, ts, {', '.join(fields)}, "
        "COUNT(*) OVER (PARTITION BY run_id) AS n, "
        "MAX(CASE WHEN estimated THEN 1 ELSE 0 END) OVER (PARTITION BY run_id) AS est, "
        f"NTILE({max(1, budget // 2)}) OVER (PARTITION BY run_id ORDER BY seq) AS bucket "
        f"FROM {table} WHERE {' AND '.join(where)})"
    ]
    for i, name in enumerate(fields):  # names come from SERIES_UNITS, never from the caller
        sql.append(
            f", f{i} AS (SELECT run_id, seq, ts, {name} AS v, n, est, "
            f"ROW_NUMBER() OVER (PARTITION BY run_id, bucket ORDER BY {name} ASC, seq) AS lo, "
            f"ROW_NUMBER() OVER (PARTITION BY run_id, bucket ORDER BY {name} DESC, seq) AS hi "
            f"FROM base WHERE {name} IS NOT NULL)"
        )
    selects = [
        f"SELECT {i} AS f, run_id, seq, ts, v, n, est FROM f{i} WHERE n <= %s OR lo = 1 OR hi = 1"
        for i in range(len(fields))
    ]
    params += [budget] * len(fields)
    query = " ".join(sql) + " " + " UNION ALL ".join(selects) + " ORDER BY 1, 2, 3"
    with rehydrated(runs), connection.cursor() as cursor:  # packed samples read as raw ones
        cursor.execute(query, params)
        rows = cursor.fetchall()
    for f_index, run_id, _seq, ts, value, n, est in rows:
        result.series[run_id][fields[f_index]].append((_aware(ts), float(value)))
        result.samples[run_id] = int(n)
        result.estimated[run_id] = bool(est)
    return result


def telemetry_by_rank(*, run: Run) -> list[dict]:
    """Per device (DDP rank) of a run: its samples, mean utilisation and step time, peak memory, the
    last device name. A straggler shows as the rank with the longest steps or the lowest
    utilisation."""
    with rehydrated([run]):
        return _by_rank(run)


def _by_rank(run: Run) -> list[dict]:
    from django.db.models import Avg

    return list(
        TelemetrySample.objects.of_run(run)
        .values("rank")
        .annotate(
            samples=Count("id"),
            util_pct=Avg("util_pct"),
            step_time_s=Avg("step_time_s"),
            mem_used_mb=Max("mem_used_mb"),
            device=Max("device"),
        )
        .order_by("rank")
    )
