"""Usage of a run's samples summed in the database, per price period: apps.pricing.bill in SQL.

A batch changes only the intervals it touches: the ones its new samples close, and the one
after each (whose predecessor it now is). ``usage_delta`` scans the stored rows of a few seq
ranges around the batch and sums every interval twice, once over the rows now stored
(sign +1) and once without the rows just inserted (sign -1): untouched intervals cancel,
and the difference is what the batch adds to the bill, wherever in the run it landed.
A range (lo, hi] counts the rows lo < seq <= hi; the row at lo only serves as predecessor.
Rules (apps.pricing.bill has them in Python, and tests hold both to the same figures):
  linked    the previous row in seq order is of the same attempt; else dt = 0 and the
            cumulative counters count from 0
  dt        ts - previous ts, split exactly at the price boundaries
  busy      dt x util/100 clamped to [0, 1]; unknown util counts as busy
  energy    counter delta; else mean known power x dt; else modelled power x busy x dt
            (flagged estimated); split in proportion to time
  tokens, steps  cumulative deltas, never negative, in the closing sample's period
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from apps.pricing.cost_engine import Usage
from apps.telemetry.models import TelemetrySample

# Seqs further apart than this in one batch are looked at as separate ranges (a batch of
# stragglers from all over a run re-prices a few rows around each, not everything between).
CLUSTER_GAP = 64
SEQ_MAX = 2**62

_EPOCH = {
    "postgresql": "EXTRACT(EPOCH FROM {col})::double precision",
    "sqlite": "((julianday({col}) - 2440587.5) * 86400.0)",
}
_FRESH = {  # the seqs just inserted, as a one-column relation
    "postgresql": "SELECT unnest(%s::bigint[]) AS s",
    "sqlite": "SELECT value AS s FROM json_each(%s)",
}
_GREATEST = {"postgresql": "GREATEST", "sqlite": "MAX"}
_LEAST = {"postgresql": "LEAST", "sqlite": "MIN"}


@dataclass(frozen=True)
class PeriodUsage:
    period: int  # index into the boundaries: -1 before the first one
    sign: int  # +1: the rows stored now; -1: the same ranges before the batch
    usage: Usage
    max_step: int
    estimated: bool


@dataclass(frozen=True)
class UsageDelta:
    periods: list[PeriodUsage]
    backwards_seq: int | None  # a counted row whose ts is before its predecessor's (same attempt)


def seq_clusters(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted seqs as (first, last) clusters, split where they are more than CLUSTER_GAP apart."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and s - out[-1][1] <= CLUSTER_GAP:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def batch_ranges(*, run_id: int, seqs: list[int]) -> list[tuple[int, int]]:
    """The (lo, hi] seq ranges a batch touches, from the rows stored before it (one query).

    lo: the stored row just before a cluster (-1: none, count from the run's start); hi: the
    stored row just after it (SEQ_MAX: none). Overlapping ranges are merged, so no row is
    counted twice.
    """
    clusters = seq_clusters(seqs)
    table = TelemetrySample._meta.db_table
    values = ", ".join(["(%s, %s)"] * len(clusters))
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH c(lo, hi) AS (VALUES {values}) "
            f"SELECT (SELECT MAX(seq) FROM {table} WHERE run_id = %s AND seq < c.lo), "
            f"(SELECT MIN(seq) FROM {table} WHERE run_id = %s AND seq > c.hi) FROM c ORDER BY c.lo",
            [v for c in clusters for v in c] + [run_id, run_id],
        )
        bounds = [(-1 if lo is None else lo, SEQ_MAX if hi is None else hi) for lo, hi in cursor.fetchall()]
    merged: list[tuple[int, int]] = []
    for lo, hi in bounds:
        if merged and lo < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def usage_delta(*, run_id: int, ranges: list[tuple[int, int]], fresh: list[int] | None, gpu_count: float,
                vcpus: float, memory_gb: float, boundaries: list[datetime],
                modelled_power_w: float = 0.0) -> UsageDelta:
    """Usage of the intervals counted in `ranges`, by period; minus the same without `fresh`.

    fresh=None: no subtraction (a full recompute over ranges=[(-1, SEQ_MAX)]).
    """
    vendor = connection.vendor
    table = TelemetrySample._meta.db_table
    greatest, least = _GREATEST[vendor], _LEAST[vendor]
    edges = [-1e300, *(b.timestamp() for b in boundaries), 1e300]
    periods = ", ".join(["(%s, %s, %s)"] * (len(edges) - 1))
    period_params = [v for i in range(len(edges) - 1) for v in (i - 1, edges[i], edges[i + 1])]
    range_values = ", ".join(["(%s, %s, %s)"] * len(ranges))
    range_params = [v for k, (lo, hi) in enumerate(ranges) for v in (k, lo, hi)]
    lag = ("LAG(seq) OVER w AS p_seq, LAG(attempt) OVER w AS p_attempt, LAG(ts) OVER w AS p_ts, "
           "LAG(step) OVER w AS p_step, LAG(tokens) OVER w AS p_tokens, LAG(energy_j) OVER w AS p_energy, "
           "LAG(power_w) OVER w AS p_power")
    old = (f" UNION ALL SELECT -1 AS sign, x.*, {lag} FROM x WHERE fresh = 0 "
           f"WINDOW w AS (PARTITION BY k ORDER BY seq)") if fresh is not None else ""
    fresh_rel = _FRESH[vendor]
    fresh_param = (list(fresh) if vendor == "postgresql" else json.dumps(list(fresh))) if fresh is not None else (
        [] if vendor == "postgresql" else "[]")
    sql = f"""
        WITH rg(k, lo, hi) AS (VALUES {range_values}),
        pr(period, plo, phi) AS (VALUES {periods}),
        f AS ({fresh_rel}),
        x AS (
            SELECT rg.k, rg.lo, t.seq, t.attempt, {_EPOCH[vendor].format(col="t.ts")} AS ts, t.step, t.tokens,
                   t.energy_j, t.power_w, t.util_pct, t.estimated,
                   CASE WHEN f.s IS NULL THEN 0 ELSE 1 END AS fresh
            FROM rg JOIN {table} t ON t.run_id = %s AND t.seq >= rg.lo AND t.seq <= rg.hi
            LEFT JOIN f ON f.s = t.seq
        ),
        v AS (
            SELECT 1 AS sign, x.*, {lag} FROM x WINDOW w AS (PARTITION BY k ORDER BY seq){old}
        ),
        l AS (
            SELECT *, CASE WHEN p_seq IS NOT NULL AND p_attempt = attempt THEN 1 ELSE 0 END AS linked,
                   CASE WHEN util_pct IS NULL OR util_pct >= 100 THEN 1.0
                        WHEN util_pct <= 0 THEN 0.0 ELSE util_pct / 100.0 END AS share
            FROM v WHERE seq > lo
        ),
        d AS (
            SELECT sign, seq, ts, p_ts, step, share, estimated, linked,
                   CASE WHEN linked = 1 AND ts > p_ts THEN ts - p_ts ELSE 0.0 END AS dt,
                   CASE WHEN linked = 1 AND ts < p_ts THEN 1 ELSE 0 END AS backwards,
                   CASE WHEN linked = 0 THEN {greatest}(COALESCE(tokens, 0), 0)
                        ELSE {greatest}(tokens - p_tokens, 0) END AS d_tokens,
                   CASE WHEN linked = 0 THEN {greatest}(COALESCE(step, 0), 0)
                        ELSE {greatest}(step - p_step, 0) END AS d_steps,
                   CASE WHEN linked = 0 THEN 0
                        WHEN energy_j IS NULL OR p_energy IS NULL THEN
                             CASE WHEN power_w IS NULL AND p_power IS NULL AND %s > 0 AND ts > p_ts THEN 1 ELSE 0 END
                        ELSE 0 END AS modelled,
                   CASE WHEN linked = 0 THEN {greatest}(COALESCE(energy_j, 0.0), 0.0)
                        WHEN energy_j IS NOT NULL AND p_energy IS NOT NULL THEN {greatest}(energy_j - p_energy, 0.0)
                        WHEN power_w IS NOT NULL OR p_power IS NOT NULL THEN
                             {greatest}((COALESCE(power_w, p_power) + COALESCE(p_power, power_w)) / 2.0, 0.0)
                             * (CASE WHEN ts > p_ts THEN ts - p_ts ELSE 0.0 END)
                        WHEN ts > p_ts THEN %s * share * (ts - p_ts)
                        ELSE 0.0 END AS energy
            FROM l
        ),
        s AS (
            SELECT d.*, pr.period,
                   CASE WHEN dt > 0 THEN ({least}(ts, phi) - {greatest}(p_ts, plo)) / dt ELSE 1.0 END AS frac,
                   CASE WHEN plo <= ts AND ts < phi THEN 1 ELSE 0 END AS own
            FROM d JOIN pr ON (dt > 0 AND plo < ts AND phi > p_ts) OR (dt <= 0 AND plo <= ts AND ts < phi)
        )
        SELECT sign, period, SUM(frac * dt), SUM(frac * dt * share), SUM(frac * energy),
               SUM(own * d_tokens), SUM(own * d_steps), MAX(step),
               MAX(CASE WHEN estimated OR modelled = 1 THEN 1 ELSE 0 END),
               MIN(CASE WHEN backwards = 1 AND sign = 1 THEN seq END)
        FROM s GROUP BY sign, period ORDER BY sign, period
    """
    params = [*range_params, *period_params, fresh_param, run_id, modelled_power_w, modelled_power_w]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out, backwards = [], None
    for sign, p, dt, busy, energy, tokens, steps, max_step, estimated, bad in rows:
        if bad is not None:
            backwards = bad if backwards is None else min(backwards, bad)
        dt, busy = float(dt or 0), float(busy or 0)
        usage = Usage(
            wall_s=dt, device_seconds=dt * gpu_count, busy_device_seconds=busy * gpu_count,
            energy_j=float(energy or 0), vcpu_seconds=dt * vcpus, memory_gb_seconds=dt * memory_gb,
            tokens=int(tokens or 0), steps=int(steps or 0),
        )
        out.append(PeriodUsage(period=int(p), sign=int(sign), usage=usage, max_step=int(max_step or 0),
                               estimated=bool(estimated)))
    return UsageDelta(periods=out, backwards_seq=backwards)
