"""Chart series of runs, at most a point budget each: rolled-up blocks for settled history, raw
samples for the recent tail, samples_downsampled for live updates.

A point is a bucket of consecutive samples: x (its middle, ms since the epoch, UTC), the mean
(y) and the min/max band (lo, hi), so a peak inside a bucket is still drawn. A raw sample is a
bucket of one (lo = hi = y).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import OuterRef, Subquery

from apps.core.db import epoch_ms_sql
from apps.dashboard.models import CHART_FIELDS, SeriesBlock
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from apps.telemetry.rollup import window_sql
from apps.telemetry.selectors import SERIES_UNITS, samples_downsampled

# A run with at most this many samples is bucketed straight from its samples (no blocks needed).
RAW_MAX = 8192
# Samples of a run past its last block are read from the samples; beyond this many (pricing
# stuck behind a gap), only the latest are: the chart shows a gap rather than the page slowing.
TAIL_MAX = RAW_MAX
# Live polls re-read this much before the cursor, so a batch that lands late is not missed.
LIVE_OVERLAP_S = 10.0
LIVE_BUDGET = 200

SERIES_LABELS = {
    "util_pct": "GPU utilization",
    "power_w": "Power",
    "step_time_s": "Step time",
    "micro_batch": "Micro-batch",
    "tokens_per_s": "Throughput",
    "loss": "Loss",
    "mem_used_mb": "Memory used",
    "sm_occupancy_pct": "SM occupancy (NVML GPM)",
    "tensor_active_pct": "Tensor-pipe activity (NVML GPM)",
    "dram_bw_pct": "DRAM bandwidth used (NVML GPM)",
}
# Throughput is not read from the samples' tokens_per_s (tokens of one sampling interval: a spike
# when a step ends inside it, 0 while a slow step runs) but derived per step: the run's tokens per
# step over each point's step time, so a point exists only where steps ended.
THROUGHPUT = "tokens_per_s"
# Where a run was at each point (its step, its cumulative tokens): read with every chart, so a
# chart can be drawn against steps or tokens instead of time (charts.js maps each point's time).
PROGRESS = ("step", "tokens")


def epoch_ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def _num(value) -> float:
    """Four decimals: enough for a chart (0.1 ms of step time), a third of the JSON. A float: the
    sum of an integer column (step, tokens) reads as a Decimal, which JSON would write as text."""
    return round(float(value), 4)


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
class RunSeries:
    """series[run_id][field] -> Band; estimated: runs with modelled power/energy."""

    series: dict[int, dict[str, Band]]
    estimated: set[int]

    def as_json(self, fields: tuple[str, ...]) -> dict:
        return {
            f: {str(r): bands[f].as_json() for r, bands in self.series.items() if bands[f].x}
            for f in fields
        }

    def progress_json(self) -> dict:
        """Per run, its step and cumulative tokens against time: {run: {step: {x, y}, tokens}}."""
        return {
            str(r): {f: {"x": bands[f].x, "y": bands[f].y} for f in PROGRESS if f in bands}
            for r, bands in self.series.items()
            if any(bands[f].x for f in PROGRESS if f in bands)
        }


def _bucket_rows(sql: str, params: list, fields: tuple[str, ...], series: RunSeries) -> None:
    """Add rows of (run_id, group, first ms, last ms, estimated, then min, max, sum, count per
    field)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for row in rows:
        run_id = row[0]
        bands = series.series[run_id]
        x = int((row[2] + row[3]) / 2)
        if row[4]:
            series.estimated.add(run_id)
        for i, f in enumerate(fields):
            lo, hi, total, n = row[5 + 4 * i : 9 + 4 * i]
            if n:
                bands[f].add(x, total / n, lo, hi)


def _block_buckets(
    wanted: dict[int, tuple[int, int]], fields: tuple[str, ...], series: RunSeries
) -> None:
    """wanted[run] = (upto seq, blocks per bucket): the run's blocks below upto, merged in SQL."""
    cols = ", ".join(f"MIN({f}_min), MAX({f}_max), SUM({f}_sum), SUM({f}_n)" for f in fields)
    # One SELECT per run, so each reads its own range of the (run, block) index.
    per_run = (
        f"SELECT run_id, block / %s, {epoch_ms_sql('MIN(ts_first)')}, "
        f"{epoch_ms_sql('MAX(ts_last)')}, MAX(CASE WHEN estimated THEN 1 ELSE 0 END), {cols} FROM "
        f"{SeriesBlock._meta.db_table} WHERE run_id = %s AND block < %s GROUP BY 1, 2"
    )
    _union(
        per_run,
        [(k, run_id, upto // SeriesBlock.SEQS) for run_id, (upto, k) in wanted.items()],
        fields,
        series,
    )


def _sample_buckets(
    wanted: dict[Run, tuple[int, int]], fields: tuple[str, ...], series: RunSeries
) -> None:
    """wanted[run] = (first seq, seqs per bucket): the run's samples from first seq on, grouped in
    SQL, looked for inside the run's stored span (so Postgres reads only its days' partitions)."""
    cols = ", ".join(f"MIN({f}), MAX({f}), SUM({f}), COUNT({f})" for f in fields)
    queries, params = [], []
    for run, (lo, k) in wanted.items():
        within, span = window_sql(run.samples_from, run.samples_to)
        queries.append(
            f"SELECT run_id, (seq - %s) / %s, {epoch_ms_sql('MIN(ts)')}, "
            f"{epoch_ms_sql('MAX(ts)')}, MAX(CASE WHEN estimated THEN 1 ELSE 0 END), {cols} FROM "
            f"{TelemetrySample._meta.db_table} WHERE run_id = %s AND {within} AND seq >= %s "
            "GROUP BY 1, 2"
        )
        params += [lo, k, run.pk, *span, lo]
    if queries:
        sql = (
            " UNION ALL ".join(f"SELECT * FROM ({q}) AS q{i}" for i, q in enumerate(queries))
            + " ORDER BY 1, 2"
        )
        _bucket_rows(sql, params, fields, series)


def _union(per_run: str, params: list[tuple], fields: tuple[str, ...], series: RunSeries) -> None:
    if params:
        sql = (
            " UNION ALL ".join(f"SELECT * FROM ({per_run}) AS q{i}" for i in range(len(params)))
            + " ORDER BY 1, 2"
        )
        _bucket_rows(sql, [v for p in params for v in p], fields, series)


def last_block() -> Subquery:
    """A Run annotation: the run's last rolled-up block (None: none yet), read backwards from the
    (run, block) index, so no scan of the blocks."""
    return Subquery(
        SeriesBlock.objects.filter(run_id=OuterRef("pk")).order_by("-block").values("block")[:1]
    )


def blocks_upto(runs: list[Run]) -> dict[int, int]:
    """Per run, the first seq after its rolled-up blocks (0: none). A read: blocks are built on
    beat."""
    if not runs:
        return {}
    return {
        pk: 0 if block is None else (block + 1) * SeriesBlock.SEQS
        for pk, block in Run.objects.filter(pk__in=[r.pk for r in runs])
        .annotate(last=last_block())
        .values_list("pk", "last")
    }


def _ranks(run: Run) -> int:
    return max(1, run.world_size)


def _per_bucket(samples: int, points: int, run: Run) -> int:
    """Samples per bucket: a multiple of a DDP run's ranks (their samples interleave in one seq
    order), so a point is the mean over its devices, not one rank then the other (a zigzag)."""
    ranks = _ranks(run)
    return ranks * max(1, math.ceil(math.ceil(samples / points) / ranks))


def _stored_fields(fields: tuple[str, ...]) -> tuple[str, ...]:
    """The stored series to read for these chart fields (throughput is derived from step time), and
    the run's progress (PROGRESS)."""
    read = [f for f in fields if f != THROUGHPUT]
    if THROUGHPUT in fields and "step_time_s" not in read:
        read.append("step_time_s")
    return tuple(dict.fromkeys((*read, *PROGRESS)))


def tokens_per_step(run: Run) -> float | None:
    return run.tokens / run.steps if run.steps > 0 and run.tokens > 0 else None


def _add_throughput(out: RunSeries, runs: list[Run], fields: tuple[str, ...]) -> None:
    """Each run's throughput band from its step-time band: tokens per step / step time (the band's
    low end from the slowest step of the bucket, its high end from the fastest)."""
    if THROUGHPUT not in fields:
        return
    for run in runs:
        bands = out.series.get(run.pk)
        if bands is None:
            continue
        per_step, steps, band = tokens_per_step(run), bands["step_time_s"], Band()
        if per_step:
            for x, mean, lo, hi in zip(steps.x, steps.y, steps.lo, steps.hi, strict=True):
                if lo > 0:
                    band.add(x, per_step / mean, per_step / hi, per_step / lo)
        bands[THROUGHPUT] = band


def run_series(*, runs: list[Run], fields: tuple[str, ...], budget: int) -> RunSeries:
    """Each run's whole history of these fields in about `budget` points per run and field.

    The cost depends on blocks, not samples: a run past RAW_MAX samples is read from its blocks
    (built on beat, apps.dashboard.services), merged to `budget` buckets, plus the samples after
    them in up to budget/4 more (at most TAIL_MAX: a rollup far behind shows as a gap, not a slow
    page); a smaller run is bucketed straight from its samples. Three or four queries; no writes.
    """
    wanted, fields = fields, _stored_fields(fields)
    unknown = [f for f in fields if f not in CHART_FIELDS]
    if unknown:
        raise ValueError(
            f"fields: {unknown[0]} is not a charted series ({', '.join(CHART_FIELDS)})"
        )
    # A run whose raw samples retention dropped is read from its blocks too, whatever its size.
    big = [r for r in runs if r.last_seq + 1 > RAW_MAX or r.raw_dropped_before is not None]
    upto = blocks_upto(big)
    blocks, samples = {}, {}
    for run in runs:
        if run.last_seq < 0:
            continue
        rolled = upto.get(run.pk, 0)
        if rolled > 0:
            blocks[run.pk] = (rolled, max(1, math.ceil(rolled / SeriesBlock.SEQS / budget)))
        first = max(rolled, run.last_seq + 1 - TAIL_MAX, 0)
        points = budget if rolled == 0 else max(1, budget // 4)
        if first <= run.last_seq:
            samples[run] = (first, _per_bucket(run.last_seq + 1 - first, points, run))
    out = RunSeries(
        series={r.pk: {f: Band() for f in fields} for r in runs},
        estimated={r.pk for r in runs if r.energy_estimated},
    )
    _block_buckets(blocks, fields, out)  # history first: rows arrive in time order per run
    _sample_buckets(samples, fields, out)
    _add_throughput(out, runs, wanted)
    return out


def live_series(*, runs: list[Run], fields: tuple[str, ...], since: datetime) -> RunSeries:
    """Samples of these runs taken since `since` (less LIVE_OVERLAP_S), as raw points; for
    polling."""
    wanted, fields = fields, _stored_fields(fields)
    data = samples_downsampled(
        runs=runs,
        fields=list(fields),
        budget=LIVE_BUDGET,
        since=since - timedelta(seconds=LIVE_OVERLAP_S),
    )
    out = RunSeries(series={}, estimated={r for r, est in data.estimated.items() if est})
    ranks = {r.pk: _ranks(r) for r in runs}
    for run_id, by_field in data.series.items():
        bands = {f: Band() for f in fields}
        n = ranks.get(run_id, 1)
        for f, points in by_field.items():
            for i in range(
                0, len(points), n
            ):  # a DDP run: one point per step of its ranks (their mean)
                group = [v for _, v in points[i : i + n]]
                x = epoch_ms(points[i + len(group) // 2][0]) if n > 1 else epoch_ms(points[i][0])
                bands[f].add(x, sum(group) / len(group), min(group), max(group))
        out.series[run_id] = bands
    _add_throughput(out, runs, wanted)
    return out


def series_meta(fields: tuple[str, ...]) -> dict[str, dict]:
    """Label and unit of each field, for chart titles and axes."""
    return {f: {"label": SERIES_LABELS[f], "unit": SERIES_UNITS.get(f, "")} for f in fields}
