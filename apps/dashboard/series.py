"""Chart series of runs, at most a point budget each: rolled-up blocks for settled history, raw
samples for the recent tail, samples_downsampled for live updates.

A point is a bucket of consecutive samples: x (its middle, ms since the epoch, UTC), the mean
(y) and the min/max band (lo, hi), so a peak inside a bucket is still drawn. A raw sample is a
bucket of one (lo = hi = y).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Q
from django.utils.dateparse import parse_datetime

from apps.dashboard.models import CHART_FIELDS, SeriesBlock
from apps.dashboard.services import series_blocks_refresh
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from apps.telemetry.selectors import SERIES_UNITS, samples_downsampled

# A run with at most this many samples is charted from its raw samples (no blocks needed).
RAW_MAX = 1024
# Samples of a run past its last block are read raw; beyond this many (pricing stuck behind a
# gap), only the latest are: the chart shows the gap rather than the page slowing down.
TAIL_MAX = 4 * RAW_MAX
# Live polls re-read this much before the cursor, so a batch that lands late is not missed.
LIVE_OVERLAP_S = 10.0
LIVE_BUDGET = 200

SERIES_LABELS = {
    "util_pct": "GPU utilization", "power_w": "Power", "step_time_s": "Step time", "micro_batch": "Micro-batch",
    "tokens_per_s": "Throughput", "loss": "Loss",
}


def epoch_ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def _aware(value) -> datetime:
    if isinstance(value, str):
        value = parse_datetime(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _num(value: float) -> float:
    """Five significant digits: enough for a chart, a third of the JSON."""
    return float(f"{value:.5g}")


@dataclass
class Band:
    x: list[int] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)

    def add(self, x: int, mean: float, lo: float, hi: float) -> None:
        self.x.append(x)
        self.y.append(_num(mean))
        self.lo.append(_num(lo))
        self.hi.append(_num(hi))

    def as_json(self) -> dict:
        return {"x": self.x, "y": self.y, "lo": self.lo, "hi": self.hi}


@dataclass
class _Bucket:
    """Samples summarised: first/last timestamp and, per field, (min, max, sum, count)."""

    first: datetime
    last: datetime
    stats: dict[str, tuple[float, float, float, int]]
    estimated: bool = False

    def merge(self, other: _Bucket) -> _Bucket:
        stats = dict(self.stats)
        for f, (lo, hi, total, n) in other.stats.items():
            if f in stats:
                a = stats[f]
                stats[f] = (min(a[0], lo), max(a[1], hi), a[2] + total, a[3] + n)
            else:
                stats[f] = (lo, hi, total, n)
        return _Bucket(min(self.first, other.first), max(self.last, other.last), stats,
                       self.estimated or other.estimated)


@dataclass
class RunSeries:
    """series[run_id][field] -> Band; estimated: runs with modelled power/energy."""

    series: dict[int, dict[str, Band]]
    estimated: set[int]

    def as_json(self, fields: tuple[str, ...]) -> dict:
        return {f: {str(r): bands[f].as_json() for r, bands in self.series.items() if bands[f].x} for f in fields}


def _reduce(buckets: list[_Bucket], fields: tuple[str, ...], budget: int) -> dict[str, Band]:
    """Merge consecutive buckets into at most `budget` points per field."""
    size = max(1, math.ceil(len(buckets) / budget))
    bands = {f: Band() for f in fields}
    for i in range(0, len(buckets), size):
        group = buckets[i]
        for b in buckets[i + 1:i + size]:
            group = group.merge(b)
        x = epoch_ms(group.first + (group.last - group.first) / 2)
        for f in fields:
            if f in group.stats:
                lo, hi, total, n = group.stats[f]
                bands[f].add(x, total / n, lo, hi)
    return bands


def _blocks(upto: dict[int, int], fields: tuple[str, ...], budget: int) -> dict[int, list[_Bucket]]:
    """Each run's blocks below upto[run], pre-merged in SQL to about `budget` groups."""
    wanted = {run_id: seq for run_id, seq in upto.items() if seq > 0}
    if not wanted:
        return {}
    merge = {run_id: max(1, math.ceil(seq / SeriesBlock.SEQS / budget)) for run_id, seq in wanted.items()}
    cols = ", ".join(f"MIN(b.{f}_min), MAX(b.{f}_max), SUM(b.{f}_sum), SUM(b.{f}_n)" for f in fields)
    values = ", ".join(["(CAST(%s AS BIGINT), CAST(%s AS BIGINT), CAST(%s AS BIGINT))"] * len(wanted))
    sql = (f"WITH k(run_id, k, upto) AS (VALUES {values}) "
           f"SELECT b.run_id, b.block / k.k, MIN(b.ts_first), MAX(b.ts_last), MAX(CASE WHEN b.estimated THEN 1 ELSE 0 END), "
           f"{cols} FROM {SeriesBlock._meta.db_table} b JOIN k ON b.run_id = k.run_id "
           f"WHERE b.block * {SeriesBlock.SEQS} < k.upto GROUP BY b.run_id, b.block / k.k ORDER BY 1, 2")
    params = [v for run_id, seq in wanted.items() for v in (run_id, merge[run_id], seq)]
    out: dict[int, list[_Bucket]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for row in cursor.fetchall():
            stats = {}
            for i, f in enumerate(fields):
                lo, hi, total, n = row[5 + 4 * i:9 + 4 * i]
                if n:
                    stats[f] = (float(lo), float(hi), float(total), int(n))
            out.setdefault(row[0], []).append(_Bucket(_aware(row[2]), _aware(row[3]), stats, bool(row[4])))
    return out


def _raw(starts: dict[int, int], fields: tuple[str, ...]) -> tuple[dict[int, list[_Bucket]], set[int]]:
    """Samples of each run from seq starts[run] on, one bucket each, in seq order."""
    if not starts:
        return {}, set()
    where = Q()
    for run_id, seq in starts.items():
        where |= Q(run_id=run_id, seq__gte=seq)
    rows = (TelemetrySample.objects.filter(where).order_by("run_id", "seq")
            .values_list("run_id", "ts", "estimated", *fields))
    out: dict[int, list[_Bucket]] = {}
    estimated = set()
    for run_id, ts, est, *values in rows:
        stats = {f: (v, v, v, 1) for f, v in zip(fields, values, strict=True) if v is not None}
        out.setdefault(run_id, []).append(_Bucket(ts, ts, stats))
        if est:
            estimated.add(run_id)
    return out, estimated


def run_series(*, runs: list[Run], fields: tuple[str, ...], budget: int) -> RunSeries:
    """Each run's whole history of these fields, at most `budget` points per run and field.

    Constant in the number of samples: a run past RAW_MAX samples is read from its blocks
    (rolled up here first, incrementally) plus its raw tail. About five queries in all.
    """
    unknown = [f for f in fields if f not in CHART_FIELDS]
    if unknown:
        raise ValueError(f"fields: {unknown[0]} is not a charted series ({', '.join(CHART_FIELDS)})")
    big = [r for r in runs if r.last_seq + 1 > RAW_MAX]
    upto = series_blocks_refresh(runs=big)
    blocks = _blocks(upto, fields, budget)
    starts = {r.pk: max(upto.get(r.pk, 0), r.last_seq + 1 - TAIL_MAX, 0) for r in runs if r.last_seq >= 0}
    raw, estimated = _raw(starts, fields)
    out = RunSeries(series={}, estimated=estimated | {r.pk for r in runs if r.energy_estimated})
    for run in runs:
        history = blocks.get(run.pk, [])
        if any(b.estimated for b in history):
            out.estimated.add(run.pk)
        out.series[run.pk] = _reduce(history + raw.get(run.pk, []), fields, budget)
    return out


def live_series(*, runs: list[Run], fields: tuple[str, ...], since: datetime) -> RunSeries:
    """Samples of these runs taken since `since` (less LIVE_OVERLAP_S), as raw points; for polling."""
    data = samples_downsampled(run_ids=[r.pk for r in runs], fields=list(fields), budget=LIVE_BUDGET,
                               since=since - timedelta(seconds=LIVE_OVERLAP_S))
    out = RunSeries(series={}, estimated={r for r, est in data.estimated.items() if est})
    for run_id, by_field in data.series.items():
        bands = {f: Band() for f in fields}
        for f, points in by_field.items():
            for ts, value in points:
                bands[f].add(epoch_ms(ts), value, value, value)
        out.series[run_id] = bands
    return out


def series_meta(fields: tuple[str, ...]) -> dict[str, dict]:
    """Label and unit of each field, for chart titles and axes."""
    return {f: {"label": SERIES_LABELS[f], "unit": SERIES_UNITS.get(f, "")} for f in fields}
