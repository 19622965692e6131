"""Usage of a run's samples summed in the database, one row per pricing period.

The per-interval rules are cost_engine._interval's, expressed as set-based SQL so that
pricing a batch of samples moves a few sums, not every row, out of the database:
  dt        ts - previous ts (0 for an attempt's first sample), never negative
  busy      dt x gpu_count x util/100 clamped to [0, 1]; unknown util counts as busy
  energy    counter delta when both ends have it; an attempt's first sample counts from 0;
            else the mean of the known power readings x dt; else 0; never negative
  tokens, steps  cumulative deltas, never negative; an attempt's first sample counts from 0
Counters restart with each worker attempt, hence PARTITION BY attempt. tests/apps/telemetry
checks the totals against cost_engine.price_samples over the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from apps.pricing.cost_engine import Usage
from apps.telemetry.models import TelemetrySample

_EPOCH = {
    "postgresql": "EXTRACT(EPOCH FROM {col})::double precision",
    "sqlite": "((julianday({col}) - 2440587.5) * 86400.0)",
}


@dataclass(frozen=True)
class PeriodUsage:
    period: int  # index into the boundaries: -1 before the first one
    usage: Usage
    max_step: int
    estimated: bool


def contiguous_end(*, run_id: int, after_seq: int) -> int | None:
    """The last seq of the gap-free stretch that follows after_seq (None: after_seq + 1 is missing)."""
    table = TelemetrySample._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT MAX(seq) FROM (SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS rn FROM {table} "
            f"WHERE run_id = %s AND seq > %s) AS t WHERE seq - %s = rn",
            [run_id, after_seq, after_seq],
        )
        return cursor.fetchone()[0]


def usage_rollup(*, run_id: int, after_seq: int, upto_seq: int, gpu_count: float, vcpus: float,
                 memory_gb: float, boundaries: list[datetime]) -> list[PeriodUsage]:
    """Sum the usage of samples after_seq < seq <= upto_seq, split at the pricing boundaries."""
    table = TelemetrySample._meta.db_table
    epoch = _EPOCH[connection.vendor]
    ts, prev_ts = epoch.format(col="ts"), epoch.format(col="prev_ts")
    period = "-1"
    params_period: list = []
    if boundaries:
        whens = " ".join(f"WHEN ts >= %s THEN {i}" for i in reversed(range(len(boundaries))))
        period = f"CASE {whens} ELSE -1 END"
        params_period = list(reversed(boundaries))
    sql = f"""
        WITH w AS (
            SELECT seq, ts, step, tokens, energy_j, power_w, util_pct, estimated,
                   LAG(seq) OVER a AS prev_seq, LAG(ts) OVER a AS prev_ts, LAG(step) OVER a AS prev_step,
                   LAG(tokens) OVER a AS prev_tokens, LAG(energy_j) OVER a AS prev_energy,
                   LAG(power_w) OVER a AS prev_power
            FROM {table}
            WHERE run_id = %s AND seq >= %s AND seq <= %s
            WINDOW a AS (PARTITION BY attempt ORDER BY seq)
        ), d AS (
            SELECT *, {period} AS period,
                   CASE WHEN prev_seq IS NULL OR {ts} < {prev_ts} THEN 0.0 ELSE {ts} - {prev_ts} END AS dt
            FROM w WHERE seq > %s
        )
        SELECT period,
               SUM(dt),
               SUM(dt * CASE WHEN util_pct IS NULL OR util_pct >= 100 THEN 1.0
                             WHEN util_pct <= 0 THEN 0.0 ELSE util_pct / 100.0 END),
               SUM(CASE
                     WHEN prev_seq IS NULL THEN CASE WHEN energy_j > 0 THEN energy_j ELSE 0.0 END
                     WHEN energy_j IS NOT NULL AND prev_energy IS NOT NULL THEN
                          CASE WHEN energy_j > prev_energy THEN energy_j - prev_energy ELSE 0.0 END
                     WHEN power_w IS NOT NULL OR prev_power IS NOT NULL THEN
                          (COALESCE(power_w, prev_power) + COALESCE(prev_power, power_w)) / 2.0 * dt
                     ELSE 0.0 END),
               SUM(CASE WHEN tokens > COALESCE(prev_tokens, 0) THEN tokens - COALESCE(prev_tokens, 0) ELSE 0 END),
               SUM(CASE WHEN step > COALESCE(prev_step, 0) THEN step - COALESCE(prev_step, 0) ELSE 0 END),
               MAX(step),
               MAX(CASE WHEN estimated THEN 1 ELSE 0 END)
        FROM d GROUP BY period ORDER BY period
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, max(after_seq, 0), upto_seq, *params_period, after_seq])
        rows = cursor.fetchall()
    out = []
    for p, dt, busy, energy, tokens, steps, max_step, estimated in rows:
        dt, busy = float(dt or 0), float(busy or 0)
        usage = Usage(
            wall_s=dt, device_seconds=dt * gpu_count, busy_device_seconds=busy * gpu_count,
            energy_j=max(0.0, float(energy or 0)), vcpu_seconds=dt * vcpus, memory_gb_seconds=dt * memory_gb,
            tokens=int(tokens or 0), steps=int(steps or 0),
        )
        out.append(PeriodUsage(period=int(p), usage=usage, max_step=int(max_step or 0), estimated=bool(estimated)))
    return out
